"""Outcome tracking: what the gateway served, joined with the answer the learner then gave.

    Predict ----> OutcomeTracker.record (a PredictionSink)  queue: owner, question, model, version, p
                       |  every outcome_flush_s, one batch write (off the request path)
                       v
                  session store: served entries, kept outcome_ttl_s
                       ^
    Observe -----------+ join: the newly stored events' questions -> take_served(learner key)
    ReportOutcome -----+ join: take_served("p" + prediction_id, [question])
                       |
                       v
                  OutcomeQuality.record(model, version, p, correct)  (serving/outcomes/quality.py)

Owners: a learner named by learner_id is its keyed hash (the store's learner key, so ForgetLearner
deletes its served entries too); any other learner is "p" + the prediction_id the response carried.
A served entry is taken (deleted) when joined, so an answer counts once, a retried Observe (its
events are duplicates) counts nothing, and of several events answering the same question in one
Observe the first one counts. A shadow version's entries sit beside the primary's and are joined
the same way. Before a join the tracker writes what it still holds for that owner, so a Predict
answered just before the Observe is found.
"""
from __future__ import annotations

import asyncio
import logging
import re
import time

import numpy as np

from serving import errors
from serving.metrics import Metrics
from serving.parts import PredictionRecord
from serving.sessions.keys import LearnerKeys
from serving.sessions.store import ServedEntry, SessionStore, StoreUnavailable
from serving.settings import Settings

log = logging.getLogger("routerkt.gateway.outcomes")

PREDICTION_ID = re.compile(r"[0-9a-f]{32}")
SWEEP_EVERY_S = 60.0


def prediction_owner(prediction_id: str) -> str:
    return "p" + prediction_id


class OutcomeTracker:
    """PredictionSink that remembers served predictions, and the joins with observed answers."""

    def __init__(self, settings: Settings, store: SessionStore, keys: LearnerKeys, metrics: Metrics) -> None:
        self.settings = settings
        self.store = store
        self.keys = keys
        self.metrics = metrics
        self.quality = metrics.quality
        self._pending: list[ServedEntry] = []
        self._pending_owners: set[str] = set()
        self._flush_lock = asyncio.Lock()

    # -- the sink ----------------------------------------------------------------------------------
    def record(self, prediction: PredictionRecord) -> None:
        """Queue every candidate probability of the call (no I/O here)."""
        result = prediction.result
        entries = []
        for query, learner in zip(prediction.query.learners, result.learners):
            if query.learner_id:
                owner = self.keys.learner(query.learner_id)
            elif learner.prediction_id:
                owner = prediction_owner(learner.prediction_id)
            else:
                continue
            entries += [ServedEntry(owner, int(q), result.model, learner.version, float(p))
                        for q, p in zip(query.candidate_questions.tolist(), learner.probabilities.tolist())]
        if len(self._pending) + len(entries) > self.settings.max_pending_served:
            self.metrics.served_dropped.inc(len(entries))
            return
        self._pending += entries
        self._pending_owners.update(e.owner for e in entries)

    async def maintain(self) -> None:
        """Write queued entries every outcome_flush_s; sweep expired ones (SQLite) now and then."""
        last_sweep = time.monotonic()
        while True:
            await asyncio.sleep(self.settings.outcome_flush_s)
            try:
                await self.flush()
                sweep = getattr(self.store, "sweep_served", None)
                if sweep is not None and time.monotonic() - last_sweep > SWEEP_EVERY_S:
                    last_sweep = time.monotonic()
                    await sweep(_now_ms())
            except StoreUnavailable as exc:
                log.warning("writing served predictions failed: %s", str(exc)[:300])
            except Exception:                                  # never let the loop die
                log.exception("outcome tracking upkeep failed")

    async def flush(self, owner: str | None = None) -> None:
        """Write everything queued (one batch), or nothing when `owner` is given and none of it is
        that owner's; waits for a write in progress either way. On a store failure the batch is
        dropped and counted."""
        async with self._flush_lock:
            if not self._pending or (owner is not None and owner not in self._pending_owners):
                return
            batch, self._pending, self._pending_owners = self._pending, [], set()
            try:
                await self.store.remember_served(batch, _now_ms() + int(self.settings.outcome_ttl_s * 1000))
            except StoreUnavailable:
                self.metrics.served_dropped.inc(len(batch))
                raise

    async def discard(self, owner: str) -> None:
        """Drop what is queued for `owner` (ForgetLearner), after any write in progress."""
        async with self._flush_lock:
            if owner in self._pending_owners:
                self._pending = [e for e in self._pending if e.owner != owner]
                self._pending_owners.discard(owner)

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.flush(), 2.0)
        except (StoreUnavailable, asyncio.TimeoutError):
            log.warning("served predictions still queued at shutdown were not written")

    # -- joins -------------------------------------------------------------------------------------
    async def join_observed(self, learner_key: str, questions: np.ndarray, correct: np.ndarray,
                            new: tuple[bool, ...]) -> int:
        """Record the pairs answered by the newly stored events of one Observe; returns how many."""
        answers: dict[int, int] = {}
        for q, c, is_new in zip(questions.tolist(), correct.tolist(), new):
            if is_new and q not in answers:
                answers[q] = c
        if not answers:
            return 0
        return await self._join(learner_key, answers)

    async def report(self, prediction_id: str, question_id: int, correct: int) -> int:
        """ReportOutcome: record the pair(s) of one served prediction; returns how many (0: unknown,
        expired or already reported)."""
        if not PREDICTION_ID.fullmatch(prediction_id):
            raise errors.invalid_argument("prediction_id", "must be the 32 hex characters a Predict response carried")
        if correct not in (0, 1):
            raise errors.invalid_argument("correct", f"must be 0 or 1, got {correct}")
        if question_id < 0:
            raise errors.invalid_argument("question_id", f"must be >= 0, got {question_id}")
        return await self._join(prediction_owner(prediction_id), {int(question_id): int(correct)})

    async def _join(self, owner: str, answers: dict[int, int]) -> int:
        await self.flush(owner)
        taken = await self.store.take_served(owner, list(answers), _now_ms())
        for entry in taken:
            self.quality.record(entry.model, entry.version, entry.probability, answers[entry.question_id])
        return len(taken)


def _now_ms() -> int:
    return int(time.time() * 1000)
