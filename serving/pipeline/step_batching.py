"""StepBatcher: concurrent step-graph calls of one model version share one backend call (issue 58).

A call joins the batch of its (model, version, graph, input shapes past the batch axis) that is still
gathering. A batch is sent at the first of:
- `max_rows` rows in it;
- `gather_s` after its first call;
- the event loop's next turn, for a lone call: the gateway serves no other call (`inflight()` <= 1) and the
  last `lone_after` batches sent had one call each, so at low load a call never waits. `inflight()` counts
  only the calls that reached the pipeline, so under load the others may still wait in gRPC's queue: one
  gathered batch that found no company is not enough to go lone (with that rule, 56% of the onnxruntime runs
  at 8 callers were lone, mean 3.0 calls per run; with 3 in a row, mean 5.1-5.4), and at most every
  `probe_every_s` a lone call gathers anyway (a probe); a probe that finds company ends a run of lone batches.
Under load the batch fills while the event loop serves the other calls' earlier steps, so one onnxruntime
run or Triton request serves several Predicts (docs/benchmarks.md, "The ceiling": mean batch 4-5 at 8
callers with gather_s 2 ms; routerkt_step_batch_calls). Waiting only until every call in flight had joined
did not gather: the next calls are still in gRPC's queue then, not yet counted.
Every step graph's inputs and outputs are batch-first and its rows are independent, so each caller gets
back exactly its rows (the same values within float rounding: tests/integration/test_learner_states.py
compares them with the full forward). The merged call runs under the longest deadline among its callers;
each caller still waits no longer than its own. A failure is every member's, except one of `alone_after`
(a held state that Triton lost, which may be one member's): then every member is sent again on its own, so
only the members whose state is gone rebuild.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import numpy as np

Send = Callable[[dict[str, np.ndarray]], Awaitable[dict[str, np.ndarray]]]
PROBE_EVERY_S = 0.25       # a lone call gathers anyway at most this often (module docstring)
LONE_AFTER = 3             # batches of one call in a row before lone calls go at once (module docstring)


@dataclass
class _Batch:
    key: tuple                                                         # (model, version, graph)
    feeds: list[dict[str, np.ndarray]] = field(default_factory=list)
    futures: list[asyncio.Future] = field(default_factory=list)
    sends: list[tuple[float, Send]] = field(default_factory=list)     # (caller's time left, its backend call)
    rows: int = 0
    sent: bool = False


class StepBatcher:
    """Gathers step calls per key: a lone call goes at once, others wait at most `gather_s` (module docstring)."""

    def __init__(self, max_rows: int, gather_s: float = 0.0, inflight: Callable[[], int] | None = None,
                 alone_after: tuple[type[Exception], ...] = (), probe_every_s: float = PROBE_EVERY_S,
                 on_batch: Callable[[tuple, int], None] = lambda key, calls: None,
                 lone_after: int = LONE_AFTER) -> None:
        self.max_rows = max(1, max_rows)
        self.gather_s = max(0.0, gather_s)
        self.alone_after = alone_after       # failures of a merged call that may be one member's: each goes alone
        self._gathering: dict[tuple, _Batch] = {}
        self.inflight = inflight             # the calls the gateway is serving now (None: unknown, a batch waits)
        self.lone_after = max(1, lone_after)
        self._lone_run = self.lone_after     # batches of one call sent in a row (from the start: lone)
        self.probe_every_s = probe_every_s
        self._probe_at = time.monotonic() + probe_every_s     # loop time of the next probe (the default clock)
        self.on_batch = on_batch             # (key, step calls in one backend call): a metric

    async def run(self, key: tuple, feeds: dict[str, np.ndarray], send: Send, time_left_s: float) -> dict[str, np.ndarray]:
        rows = int(next(iter(feeds.values())).shape[0])
        shape_key = (key, tuple((name, a.shape[1:], a.dtype.str) for name, a in sorted(feeds.items())))
        batch = self._gathering.get(shape_key)
        loop = asyncio.get_running_loop()
        if batch is None or batch.rows + rows > self.max_rows:
            if batch is not None:
                self._flush(shape_key, batch)
            batch = self._gathering[shape_key] = _Batch(key)
            if self._lone(loop.time()):
                loop.call_soon(self._flush, shape_key, batch)
            else:
                loop.call_later(min(self.gather_s, time_left_s), self._flush, shape_key, batch)
        future = loop.create_future()
        batch.feeds.append(feeds)
        batch.futures.append(future)
        batch.sends.append((time_left_s, send))
        batch.rows += rows
        if batch.rows >= self.max_rows:
            self._flush(shape_key, batch)
        return await future              # the caller's own: cancelling it leaves the batch running

    def _lone(self, now: float) -> bool:
        """A new batch goes at the next turn: no one to wait for, unless it is time for a probe."""
        if not (self._lone_run >= self.lone_after and self.inflight is not None and self.inflight() <= 1):
            return False
        if now < self._probe_at:
            return True
        self._probe_at = now + self.probe_every_s
        return False

    def _flush(self, shape_key: tuple, batch: _Batch) -> None:
        if batch.sent:
            return
        batch.sent = True
        self._lone_run = self._lone_run + 1 if len(batch.futures) == 1 else 0
        if self._gathering.get(shape_key) is batch:
            del self._gathering[shape_key]
        task = asyncio.ensure_future(self._send(batch))
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    async def _send(self, batch: _Batch) -> None:
        self.on_batch(batch.key, len(batch.feeds))
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
