"""SessionService: Observe, ForgetLearner and ReportOutcome over the session store's calls (StoreCalls,
serving/sessions/store_calls.py, which SessionHistory shares to read a named learner's answers).

Every store call is bounded by the caller's deadline: a store that does not answer in time, or
cannot be reached, gives UNAVAILABLE ("the session store is not available") well within the
deadline, while stateless Predict (history in the request) never touches the store. StoreCalls
pings the store every `store_probe_s`: readiness reports it and the gRPC health service
`routerkt.v1.Sessions` follows it; the client reconnects by itself once the store is back.
Learner ids are turned into keyed hashes on entry (keys.py) and never logged. The parts an Observe
and a ForgetLearner tell (`tracker`, `states`) are given at construction.

With outcome tracking (`tracker`, serving/outcomes/tracker.py), an Observe also queues the join of
its newly stored events with the predictions served to the learner (in the background: a join that
fails is counted in routerkt_outcome_join_errors_total and never fails the Observe, whose events
are already stored), and ReportOutcome joins one answer with a stateless prediction. With the
learner-state cache (`states`, serving/pipeline/state_fill.py), ForgetLearner also drops the learner's
cached states, and an Observe that stored events has them advanced by those events in the background.
"""
from __future__ import annotations

import time
from typing import Protocol

import numpy as np

from serving import status_errors as errors
from serving.core.catalog import ModelCatalog
from serving.metrics import Metrics
from serving.core.calls import Deadline
from serving.core.revision import Revision
from serving.core.validation import LearnerInput
from serving.security.audit import LEARNER_PREFIX, audit
from serving.sessions.events import ObserveQuery, check_learner_id, validate_observe
from serving.sessions.keys import LearnerKeys
from serving.sessions.store import AppendResult, History, StoredEvent
from serving.sessions.store_calls import StoreCalls
from serving.settings import Settings


class OutcomeJoin(Protocol):
    """What an Observe, a ReportOutcome and a ForgetLearner tell outcome tracking (serving/outcomes/)."""

    def observed(self, learner_key: str, questions: np.ndarray, correct: np.ndarray, new: tuple[bool, ...]) -> None: ...

    async def report(self, prediction_id: str, question_id: int, correct: int) -> int: ...

    async def discard(self, owner: str) -> None: ...

class CachedStates(Protocol):
    """What ForgetLearner and Observe tell the learner-state cache (serving/pipeline/state_fill.py): drop the
    learner's states; advance them by the newly stored events (in the background)."""

    def forget(self, learner_key: str) -> int: ...

    def observed(self, learner_key: str, new: LearnerInput, revision: Revision | None = None) -> None: ...


class SessionService:
    """Observe / ForgetLearner / ReportOutcome; the store's health and upkeep are its StoreCalls'."""

    def __init__(self, settings: Settings, calls: StoreCalls, keys: LearnerKeys, catalog: ModelCatalog,
                 metrics: Metrics, tracker: OutcomeJoin | None = None, states: CachedStates | None = None) -> None:
        self.settings, self.calls, self.keys, self.catalog, self.metrics = settings, calls, keys, catalog, metrics
        self.store = calls.store
        self.tracker = tracker                          # outcome tracking, when on
        self.states = states                            # the learner-state cache's fill, when on

    @property
    def up(self) -> bool:
        return self.calls.up

    async def start(self) -> None:
        """Open and probe the store (once, before the gateway says SERVING)."""
        await self.calls.start()

    # -- calls -----------------------------------------------------------------------------------
    async def observe(self, query: ObserveQuery, deadline: Deadline) -> AppendResult:
        validate_observe(query, self.settings)
        key = self.keys.learner(query.learner_id)
        events = [StoredEvent(self.keys.event(key, event_id), int(q), s, int(c), int(t))
                  for event_id, q, s, c, t in zip(query.event_ids, query.questions.tolist(), query.stored_skills(),
                                                   query.correct.tolist(), query.timestamps.tolist())]
        keep = max(self.settings.store_keep, self.catalog.max_window())
        result = await self.calls.call("append", self.store.append(key, events, keep, int(time.time() * 1000)), deadline)
        self.metrics.events.labels(result="stored").inc(result.stored)
        self.metrics.events.labels(result="duplicate").inc(result.duplicates)
        if self.tracker is not None and result.stored:
            self.tracker.observed(key, query.questions, query.correct, result.new)    # joined in the background
        if self.states is not None and result.stored:
            self.states.observed(key, _stored(events, result.new), result.revision)   # filled in the background
        return result

    async def report_outcome(self, prediction_id: str, question_id: int, correct: int, deadline: Deadline) -> int:
        """ReportOutcome: pairs recorded (0: unknown, expired or already reported prediction)."""
        if self.tracker is None:
            raise errors.failed_precondition("this gateway does not track outcomes")
        return await self.calls.call("take_served", self.tracker.report(prediction_id, question_id, correct), deadline)

    async def forget(self, learner_id: str, deadline: Deadline) -> tuple[bool, int]:
        check_learner_id(learner_id, self.settings)
        key = self.keys.learner(learner_id)
        if self.tracker is not None:                     # nothing queued may be written after the delete
            await self.tracker.discard(key)
        if self.states is not None:                      # no state computed from the learner's answers stays
            self.states.forget(key)
        existed, deleted = await self.calls.call("forget", self.store.forget(key), deadline)
        audit("forget_learner", learner=key[:LEARNER_PREFIX], existed=existed, deleted=deleted)
        return existed, deleted

    async def history(self, learner_id: str, limit: int, deadline: Deadline) -> History:
        return await self.calls.history(self.keys.learner(learner_id), limit, deadline)


def _stored(events: list[StoredEvent], new: tuple[bool, ...]) -> LearnerInput:
    """The newly stored events as the store reads them back, without candidates."""
    history = History.of_events([event for event, stored in zip(events, new) if stored])
    return LearnerInput(history.questions, history.skills, history.correct, np.zeros(0, np.int64),
                        np.zeros((0, 1), np.int64))
