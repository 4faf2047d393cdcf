"""Outcome tracking: what the gateway served, joined with the answer the learner then gave.

    Predict ------> OutcomeTracker.record (a PredictionSink) -+
    Observe ------> OutcomeTracker.observed (after the append) +-> ONE ordered queue of operations
    ReportOutcome -> OutcomeTracker.report (awaits its result) -+          |
                                                                          v  a worker, off the request path:
                  session store: served entries (kept outcome_ttl_s)  <- remember (consecutive ones: one batch write)
                                                                      <- take_served + OutcomeQuality.record (a join)

The worker runs the operations in the order the calls made them: a Predict answered before an
Observe is remembered before that Observe's join, and a Predict made after it cannot be taken by
it. Remembering waits for outcome_flush_s to batch writes; a join starts the worker at once.
Observe does not wait for its join (its events are already durable; a failed join is counted in
routerkt_outcome_join_errors_total); ReportOutcome waits, to answer how many pairs it recorded.

Owners: a learner named by learner_id is its keyed hash (the store's learner key, so ForgetLearner
deletes its served entries too, and `discard` drops what is still queued); any other learner is
"p" + the prediction_id the response carried. A served entry is taken (deleted) when joined, so an
answer counts once, a retried Observe (its events are duplicates) counts nothing, and of several
events answering the same question in one Observe the first one counts. A shadow version's entries
sit beside the primary's and are joined the same way. The queue holds at most max_pending_served
entries; beyond that new ones are dropped and counted (routerkt_served_dropped_total).
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from serving import status_errors as errors
from serving.metrics import Metrics
from serving.pipeline.parts import PredictionRecord
from serving.sessions.keys import LearnerKeys
from serving.sessions.store import ServedEntry, SessionStore, StoreUnavailable
from serving.settings import Settings

log = logging.getLogger("routerkt.gateway.outcomes")

PREDICTION_ID = re.compile(r"[0-9a-f]{32}")
SWEEP_EVERY_S = 60.0


def prediction_owner(prediction_id: str) -> str:
    return "p" + prediction_id


@dataclass
class _Join:
    owner: str
    answers: dict[int, int]                          # question -> correct
    result: asyncio.Future | None = None             # ReportOutcome waits on it


@dataclass
class _Remember:
    entries: list[ServedEntry] = field(default_factory=list)


class OutcomeTracker:
    """PredictionSink that remembers served predictions, and the joins with observed answers."""

    def __init__(self, settings: Settings, store: SessionStore, keys: LearnerKeys, metrics: Metrics) -> None:
        self.settings = settings
        self.store = store
        self.keys = keys
        self.metrics = metrics
        self.quality = metrics.quality
        self._ops: deque[_Remember | _Join] = deque()
        self._queued = 0                               # served entries in the queue
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()                    # one worker pass at a time

    # -- producers (no I/O) ------------------------------------------------------------------------
    def on_prediction(self, prediction: PredictionRecord) -> None:
        """The sink: queue every candidate probability of the call."""
        result = prediction.result
        entries = []
        for query, learner in zip(prediction.query.learners, result.learners):
            if query.learner_id:              # the key the history source made for this call, else made here
                owner = learner.learner_key or self.keys.learner(query.learner_id)
            elif learner.prediction_id:
                owner = prediction_owner(learner.prediction_id)
            else:
                continue
            entries += [ServedEntry(owner, int(q), result.model, learner.version, float(p))
                        for q, p in zip(query.candidate_questions.tolist(), learner.probabilities.tolist())]
        if not entries:
            return
        if self._queued + len(entries) > self.settings.max_pending_served:
            self.metrics.served_dropped.inc(len(entries))
            return
        if self._ops and isinstance(self._ops[-1], _Remember):
            self._ops[-1].entries.extend(entries)
        else:
            self._ops.append(_Remember(entries))
        self._queued += len(entries)

    def observed(self, learner_key: str, questions: np.ndarray, correct: np.ndarray, new: tuple[bool, ...]) -> None:
        """Queue the join of one Observe's newly stored events (first answer per question)."""
        answers: dict[int, int] = {}
        for q, c, is_new in zip(questions.tolist(), correct.tolist(), new):
            if is_new and q not in answers:
                answers[q] = c
        if not answers:
            return
        if len(self._ops) >= self.settings.max_pending_served:        # the worker is far behind: drop
            self.metrics.outcome_join_errors.inc()
            return
        self._ops.append(_Join(learner_key, answers))
        self._wake.set()

    async def report(self, prediction_id: str, question_id: int, correct: int) -> int:
        """ReportOutcome: record the pair(s) of one served prediction; returns how many (0: unknown,
        expired or already reported)."""
        if not PREDICTION_ID.fullmatch(prediction_id):
            raise errors.invalid_argument("prediction_id", "must be the 32 hex characters a Predict response carried")
        if correct not in (0, 1):
            raise errors.invalid_argument("correct", f"must be 0 or 1, got {correct}")
        if question_id < 0:
            raise errors.invalid_argument("question_id", f"must be >= 0, got {question_id}")
        join = _Join(prediction_owner(prediction_id), {int(question_id): int(correct)},
                     asyncio.get_running_loop().create_future())
        self._ops.append(join)
        self._wake.set()
        return await asyncio.shield(join.result)

    # -- the worker --------------------------------------------------------------------------------
    async def maintain(self) -> None:
        """Run the queue: at once for a join, every outcome_flush_s otherwise; sweep expired
        entries now and then (SessionStore.sweep_served)."""
        last_sweep = time.monotonic()
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.settings.outcome_flush_s)
            except asyncio.TimeoutError:
                pass
            try:
                await self.drain()
                if time.monotonic() - last_sweep > SWEEP_EVERY_S:
                    last_sweep = time.monotonic()
                    await self.store.sweep_served(_now_ms())
            except StoreUnavailable as exc:
                log.warning("sweeping served predictions failed: %s", str(exc)[:300])
            except Exception:                                  # never let the loop die
                log.exception("outcome tracking upkeep failed")

    async def drain(self) -> None:
        """Run every queued operation, in order (tests and shutdown call it too)."""
        async with self._lock:
            self._wake.clear()
            while self._ops:
                op = self._ops.popleft()
                if isinstance(op, _Remember):
                    self._queued -= len(op.entries)
                    await self._remember(op.entries)
                else:
                    await self._join(op)

    async def _remember(self, entries: list[ServedEntry]) -> None:
        try:
            await self.store.remember_served(entries, _now_ms() + int(self.settings.outcome_ttl_s * 1000))
        except StoreUnavailable as exc:
            self.metrics.served_dropped.inc(len(entries))
            log.warning("writing served predictions failed: %s", str(exc)[:300])

    async def _join(self, join: _Join) -> None:
        try:
            taken = await self.store.take_served(join.owner, list(join.answers), _now_ms())
        except StoreUnavailable as exc:
            self.metrics.outcome_join_errors.inc()
            log.warning("joining answers with served predictions failed: %s", str(exc)[:300])
            if join.result is not None and not join.result.done():
                join.result.set_exception(exc)
            return
        for entry in taken:
            self.quality.add_outcome(entry.model, entry.version, entry.probability, join.answers[entry.question_id])
        if join.result is not None and not join.result.done():
            join.result.set_result(len(taken))

    async def discard(self, owner: str) -> None:
        """Drop what is queued for `owner` (ForgetLearner), after the worker pass in progress."""
        async with self._lock:
            for op in self._ops:
                if isinstance(op, _Remember):
                    kept = [e for e in op.entries if e.owner != owner]
                    self._queued -= len(op.entries) - len(kept)
                    op.entries[:] = kept

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.drain(), 2.0)
        except asyncio.TimeoutError:
            log.warning("outcome tracking: operations still queued at shutdown were dropped")


def _now_ms() -> int:
    return int(time.time() * 1000)
