"""StepBatcher: concurrent step-graph calls of one model version share one backend call (issue 58).

A call joins the batch of its (model, version, graph, input shapes past the batch axis) that is still
gathering; the first one schedules the flush for the event loop's next turn, so every call that reaches
this point in the same turn (several Predicts whose store reads came back together) goes in one
onnxruntime run or one Triton request, up to `max_rows` rows. Every step graph's inputs and outputs are
batch-first and its rows are independent, so each caller gets back exactly its rows (the same values
within float rounding: tests/integration/test_learner_states.py compares them with the full forward).
The merged call runs under the longest deadline among its callers; each caller still waits no longer
than its own. A failure is every member's.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import numpy as np

Send = Callable[[dict[str, np.ndarray]], Awaitable[dict[str, np.ndarray]]]


@dataclass
class _Batch:
    feeds: list[dict[str, np.ndarray]] = field(default_factory=list)
    futures: list[asyncio.Future] = field(default_factory=list)
    sends: list[tuple[float, Send]] = field(default_factory=list)     # (caller's time left, its backend call)
    rows: int = 0


class StepBatcher:
    """Gathers step calls per key within one event-loop turn (see the module docstring)."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max(1, max_rows)
        self._gathering: dict[tuple, _Batch] = {}
        self.calls = 0                      # backend calls made (for tests and benchmarks)
        self.joined = 0                     # step calls that went in them

    async def run(self, key: tuple, feeds: dict[str, np.ndarray], send: Send, time_left_s: float) -> dict[str, np.ndarray]:
        rows = int(next(iter(feeds.values())).shape[0])
        shape_key = (key, tuple((name, a.shape[1:], a.dtype.str) for name, a in sorted(feeds.items())))
        batch = self._gathering.get(shape_key)
        if batch is None or batch.rows + rows > self.max_rows:
            batch = self._gathering[shape_key] = _Batch()
            asyncio.get_running_loop().call_soon(self._flush, shape_key, batch)
        future = asyncio.get_running_loop().create_future()
        batch.feeds.append(feeds)
        batch.futures.append(future)
        batch.sends.append((time_left_s, send))
        batch.rows += rows
        return await asyncio.shield(future)

    def _flush(self, shape_key: tuple, batch: _Batch) -> None:
        if self._gathering.get(shape_key) is batch:
            del self._gathering[shape_key]
        task = asyncio.ensure_future(self._send(batch))
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    async def _send(self, batch: _Batch) -> None:
        self.calls += 1
        self.joined += len(batch.feeds)
        send = max(batch.sends, key=lambda s: s[0])[1]
        try:
            if len(batch.feeds) == 1:
                parts = [await send(batch.feeds[0])]
            else:
                merged = {name: np.concatenate([f[name] for f in batch.feeds]) for name in batch.feeds[0]}
                outputs = await send(merged)
                parts, start = [], 0
                for f in batch.feeds:
                    n = int(next(iter(f.values())).shape[0])
                    parts.append({name: out[start:start + n] for name, out in outputs.items()})
                    start += n
        except BaseException as exc:                         # every member gets the failure (or the cancel)
            for future in batch.futures:
                if not future.done():
                    future.set_exception(exc if isinstance(exc, Exception) else asyncio.CancelledError())
            if not isinstance(exc, Exception):
                raise
            return
        for future, part in zip(batch.futures, parts):
            if not future.done():
                future.set_result(part)
