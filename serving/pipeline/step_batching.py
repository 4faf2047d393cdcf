"""StepBatcher: concurrent step-graph calls of one model version share one backend call (issue 58).

A call joins the batch of its (model, version, graph, input shapes past the batch axis) that is still
gathering, up to `max_rows` rows. A batch is sent when the first of these comes:
- every call in flight that could still join is already waiting in a batch (`arriving()`, the pipeline's
  calls in flight: with one caller that is at once, so a lone call never waits);
- `gather_s` after its first call (0: the event loop's next turn, so only calls that reach this point in the
  same turn share it).
While the event loop is busy with the other calls' earlier steps the batch fills, so under load one
onnxruntime run or Triton request serves several Predicts (docs/benchmarks.md, "The ceiling").
Every step graph's inputs and outputs are batch-first and its rows are independent, so each caller gets
back exactly its rows (the same values within float rounding: tests/integration/test_learner_states.py
compares them with the full forward). The merged call runs under the longest deadline among its callers;
each caller still waits no longer than its own. A failure is every member's, except one of `alone_after`
(a held state that Triton lost, which may be one member's): then every member is sent again on its own, so
only the members whose state is gone rebuild.
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
    sent: bool = False


class StepBatcher:
    """Gathers step calls per key until no other call can join or `gather_s` has passed (module docstring)."""

    def __init__(self, max_rows: int, gather_s: float = 0.0,
                 arriving: Callable[[], int] | None = None,
                 alone_after: tuple[type[Exception], ...] = ()) -> None:
        self.max_rows = max(1, max_rows)
        self.gather_s = max(0.0, gather_s)
        self.arriving = arriving             # calls in flight that may reach the batcher, waiting ones included
                                             # (None: unknown, a batch waits its gather_s)
        self._gathering: dict[tuple, _Batch] = {}
        self._waiting = 0                    # calls in batches not sent yet
        self.alone_after = alone_after       # failures of a merged call that may be one member's: each goes alone
        self.calls = 0                      # backend calls made (for tests and benchmarks)
        self.joined = 0                     # step calls that went in them

    async def run(self, key: tuple, feeds: dict[str, np.ndarray], send: Send, time_left_s: float) -> dict[str, np.ndarray]:
        rows = int(next(iter(feeds.values())).shape[0])
        shape_key = (key, tuple((name, a.shape[1:], a.dtype.str) for name, a in sorted(feeds.items())))
        batch = self._gathering.get(shape_key)
        loop = asyncio.get_running_loop()
        if batch is None or batch.rows + rows > self.max_rows:
            if batch is not None:
                self._flush(shape_key, batch)
            batch = self._gathering[shape_key] = _Batch()
            if self.gather_s > 0:
                loop.call_later(min(self.gather_s, time_left_s), self._flush, shape_key, batch)
            else:
                loop.call_soon(self._flush, shape_key, batch)
        future = loop.create_future()
        batch.feeds.append(feeds)
        batch.futures.append(future)
        batch.sends.append((time_left_s, send))
        batch.rows += rows
        self._waiting += 1
        if self.arriving is not None and self._waiting >= self.arriving():   # nobody else can come: send them
            for waiting_key, gathering in list(self._gathering.items()):
                self._flush(waiting_key, gathering)
        return await asyncio.shield(future)

    def _flush(self, shape_key: tuple, batch: _Batch) -> None:
        if batch.sent:
            return
        batch.sent = True
        self._waiting -= len(batch.futures)
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
                try:
                    parts = await self._merged(send, batch.feeds)
                except self.alone_after:                     # whose? each member goes again on its own
                    self._settle(batch.futures, await asyncio.gather(
                        *(member(feeds) for (_, member), feeds in zip(batch.sends, batch.feeds)),
                        return_exceptions=True))
                    return
        except BaseException as exc:                         # every member gets the failure (or the cancel)
            for future in batch.futures:
                if not future.done():
                    future.set_exception(exc if isinstance(exc, Exception) else asyncio.CancelledError())
            if not isinstance(exc, Exception):
                raise
            return
        self._settle(batch.futures, parts)

    @staticmethod
    async def _merged(send: Send, feeds: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """One backend call of every member's rows; each member's rows of its outputs."""
        merged = {name: np.concatenate([f[name] for f in feeds]) for name in feeds[0]}
        outputs = await send(merged)
        parts, start = [], 0
        for f in feeds:
            n = int(next(iter(f.values())).shape[0])
            parts.append({name: out[start:start + n] for name, out in outputs.items()})
            start += n
        return parts

    @staticmethod
    def _settle(futures: list[asyncio.Future], results: list) -> None:
        for future, result in zip(futures, results):
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result if isinstance(result, Exception) else asyncio.CancelledError())
            else:
                future.set_result(result)
