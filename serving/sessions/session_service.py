"""SessionService: Observe and ForgetLearner over a SessionStore, and the stored histories that
SessionHistory (serving/sessions/history.py) reads when a request names the learner.

Every store call is bounded by the caller's deadline: a store that does not answer in time, or
cannot be reached, gives UNAVAILABLE ("the session store is not available") well within the
deadline, while stateless Predict (history in the request) never touches the store. A background
loop pings the store every `store_probe_s`: readiness reports it and the gRPC health service
`routerkt.v1.Sessions` follows it; the client reconnects by itself once the store is back.
Learner ids are turned into keyed hashes on entry (keys.py) and never logged.

With outcome tracking (`tracker`, serving/outcomes/tracker.py), an Observe also queues the join of
its newly stored events with the predictions served to the learner (in the background: a join that
fails is counted in routerkt_outcome_join_errors_total and never fails the Observe, whose events
are already stored), and ReportOutcome joins one answer with a stateless prediction. With the
learner-state cache (`states`, serving/pipeline/state_fill.py), ForgetLearner also drops the learner's
cached states, and an Observe that stored events has them advanced by those events in the background.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

import numpy as np

from serving import errors
from serving.core.catalog import ModelCatalog
from serving.metrics import Metrics
from serving.core.calls import Deadline
from serving.core.validation import LearnerInput
from serving.security.audit import LEARNER_PREFIX, audit
from serving.sessions.events import ObserveQuery, check_learner_id, validate_observe
from serving.sessions.keys import LearnerKeys
from serving.sessions.store import AppendResult, History, SessionStore, StoredEvent, StoreUnavailable
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

    def observed(self, learner_key: str, new: LearnerInput) -> None: ...


log = logging.getLogger("routerkt.gateway.sessions")

UNAVAILABLE = "the session store is not available; retry shortly"


class SessionService:
    """Observe / ForgetLearner / stored histories, with metrics and store health."""

    def __init__(self, settings: Settings, store: SessionStore, keys: LearnerKeys, catalog: ModelCatalog,
                 metrics: Metrics) -> None:
        self.settings = settings
        self.store = store
        self.keys = keys
        self.catalog = catalog
        self.metrics = metrics
        self.tracker: OutcomeJoin | None = None        # set by create_server when outcomes are tracked
        self.states: CachedStates | None = None        # set by create_server with the learner-state path
        self.up = False

    async def start(self) -> None:
        try:
            await self.store.open()
            await self.store.ping()
            self._set_up(True)
        except StoreUnavailable as exc:
            log.error("session store (%s) is not available: %s", self.store.kind, str(exc)[:300])
            self._set_up(False)

    async def close(self) -> None:
        await self.store.close()

    async def maintain(self) -> None:
        """Ping the store (health) and, every store_expiry_s, expire its inactive learners (SessionStore.expire)."""
        last_expiry = time.monotonic()
        while True:
            await asyncio.sleep(self.settings.store_probe_s)
            try:
                await asyncio.wait_for(self.store.ping(), self.settings.store_probe_s)
                self._set_up(True)
                if time.monotonic() - last_expiry > self.settings.store_expiry_s:
                    last_expiry = time.monotonic()
                    gone = await self.store.expire(int(time.time() * 1000))
                    if gone:
                        log.info("session store: %d inactive learners expired", gone)
            except (StoreUnavailable, asyncio.TimeoutError):
                self._set_up(False)
            except Exception:                                  # never let the loop die
                log.exception("session store upkeep failed")

    def _set_up(self, up: bool) -> None:
        if up != self.up:
            level = logging.INFO if up else logging.WARNING
            log.log(level, "session store (%s) is %s", self.store.kind, "available" if up else "NOT available")
        self.up = up
        self.metrics.store_up.set(1 if up else 0)

    # -- calls -----------------------------------------------------------------------------------
    async def observe(self, query: ObserveQuery, deadline: Deadline) -> AppendResult:
        validate_observe(query, self.settings)
        key = self.keys.learner(query.learner_id)
        events = [StoredEvent(self.keys.event(key, event_id), int(q), s, int(c), int(t))
                  for event_id, q, s, c, t in zip(query.event_ids, query.questions.tolist(), query.stored_skills(),
                                                   query.correct.tolist(), query.timestamps.tolist())]
        keep = max(self.settings.store_keep, self.catalog.max_window())
        result = await self._call("append", self.store.append(key, events, keep, int(time.time() * 1000)), deadline)
        self.metrics.events.labels(result="stored").inc(result.stored)
        self.metrics.events.labels(result="duplicate").inc(result.duplicates)
        if self.tracker is not None and result.stored:
            self.tracker.observed(key, query.questions, query.correct, result.new)    # joined in the background
        if self.states is not None and result.stored:
            self.states.observed(key, _stored(events, result.new))                    # filled in the background
        return result

    async def report_outcome(self, prediction_id: str, question_id: int, correct: int, deadline: Deadline) -> int:
        """ReportOutcome: pairs recorded (0: unknown, expired or already reported prediction)."""
        if self.tracker is None:
            raise errors.failed_precondition("this gateway does not track outcomes")
        return await self._call("take_served", self.tracker.report(prediction_id, question_id, correct), deadline)

    async def forget(self, learner_id: str, deadline: Deadline) -> tuple[bool, int]:
        check_learner_id(learner_id, self.settings)
        key = self.keys.learner(learner_id)
        if self.tracker is not None:                     # nothing queued may be written after the delete
            await self.tracker.discard(key)
        if self.states is not None:                      # no state computed from the learner's answers stays
            self.states.forget(key)
        existed, deleted = await self._call("forget", self.store.forget(key), deadline)
        audit("forget_learner", learner=key[:LEARNER_PREFIX], existed=existed, deleted=deleted)
        return existed, deleted

    async def history(self, learner_id: str, limit: int, deadline: Deadline) -> History:
        return await self._call("history", self.store.history(self.keys.learner(learner_id), limit), deadline)

    async def _call(self, operation: str, coro, deadline: Deadline):
        timeout = deadline.remaining() - self.settings.deadline_margin_s
        if timeout <= 0:                                 # the caller's time is up: the store is not asked
            coro.close()
            raise errors.deadline_exceeded("the call's deadline passed before the session store was asked")
        started = time.perf_counter()
        try:
            result = await asyncio.wait_for(coro, timeout)
        except asyncio.TimeoutError:
            self.metrics.store_errors.labels(operation=operation).inc()
            log.warning("session store %s did not answer within the call's deadline (%.3fs)", operation, timeout)
            raise errors.deadline_exceeded("the session store did not answer within the call's deadline") from None
        except StoreUnavailable as exc:
            coro.close()
            self.metrics.store_errors.labels(operation=operation).inc()
            self._set_up(False)
            log.warning("session store %s failed: %s", operation, str(exc)[:300])
            raise errors.unavailable(UNAVAILABLE) from None
        finally:
            self.metrics.store_seconds.labels(operation=operation).observe(time.perf_counter() - started)
        self._set_up(True)
        return result


def _stored(events: list[StoredEvent], new: tuple[bool, ...]) -> LearnerInput:
    """The newly stored events as the store reads them back, without candidates."""
    history = History.of_events([event for event, stored in zip(events, new) if stored])
    return LearnerInput(history.questions, history.skills, history.correct, np.zeros(0, np.int64),
                        np.zeros((0, 1), np.int64))
