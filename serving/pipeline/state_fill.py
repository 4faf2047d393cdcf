"""StateFill: what Observe and ForgetLearner do to the learner-state cache (serving/state/, issue 50).

ForgetLearner drops every cached state of the learner, and has the states Triton holds for it deleted there
(held_drop, in the background: unreachable once the entries are gone, they would otherwise wait for eviction).
Observe, once its events are stored (the
caller's answer does not wait), advances each cached state of the learner (one per model version
held) by the newly stored answers with step_append, in the background, so that the learner's next
Predict by learner_id is a `hit` (step_next only) instead of appending on the caller's time. A fill
never decides an answer: Predict still compares the entry's history with the store's (a fill that
raced another Observe is `stale` there and rebuilt). Results in routerkt_state_fills_total: filled,
dropped (the window would slide, or more than max_appends answers), superseded (a Predict replaced
the entry meanwhile), skipped (more than `max_inflight` fills running), failed (the backend; the
entry is dropped). A Predict by learner_id of a learner whose fill is running waits for it (it would
otherwise append the same answers again). `routerkt serve --no-fill-on-observe`: Observe only stores.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import numpy as np

from routerkt.contract.step_signature import STATE_REF, STEP_GRAPHS
from serving.core.calls import Deadline
from serving.core.revision import Revision
from serving.core.validation import LearnerInput
from serving.status_errors import ServingError
from serving.metrics import Metrics
from serving.state.learner_states import LearnerStates

if TYPE_CHECKING:
    from serving.pipeline.prediction import PredictionService

log = logging.getLogger("routerkt.gateway.states")

MAX_FILLS = 64            # fills in flight at once; beyond: skipped (the next Predict appends instead)


class StateFill:
    """The session service's CachedStates (serving/sessions/session_service.py) and a Background part."""

    def __init__(self, service: PredictionService, states: LearnerStates, metrics: Metrics, fill: bool = True,
                 max_inflight: int = MAX_FILLS) -> None:
        self.service = service
        self.fill = fill                                   # False (--no-fill-on-observe): Observe only stores
        self.states = states
        self.metrics = metrics
        self.max_inflight = max_inflight
        self._tasks: set[asyncio.Task] = set()

    def forget(self, learner_key: str) -> int:
        held = self.states.held_by(learner_key)
        if held:
            self._start(self._drop_held(held))
        return self.states.forget(learner_key)

    async def _drop_held(self, held: dict[tuple[str, int], list[int]]) -> None:
        for (name, version), keys in held.items():
            try:
                model = self.service.catalog.get(name, version)
                await self.service.backend.infer_step(model, STEP_GRAPHS[model.step_state].held.drop.name,
                                                      {STATE_REF.name: np.array(keys, dtype=np.int64)},
                                                      self.service.settings.default_deadline_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:                          # unreachable anyway: it ages out of Triton's LRU
                log.debug("deleting held states failed: %s", type(exc).__name__)

    def _start(self, work) -> asyncio.Task:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def observed(self, learner_key: str, new: LearnerInput, revision: Revision | None = None) -> None:
        """`new`: the events Observe stored for the learner (raw ids, oldest first, no candidates); `revision`:
        the store's log after them."""
        held = self.states.cache.versions_of(learner_key) if self.fill else []
        if not held:
            return
        if len(self._tasks) >= self.max_inflight:
            for name, _ in held:
                self.metrics.state_fills.labels(model=name, result="skipped").inc()
            return
        task = self._start(self._fill(learner_key, new, held, revision))
        self.states.fill_started(learner_key, task)      # the learner's next Predict waits for it

    async def _fill(self, learner_key: str, new: LearnerInput, held: list[tuple[str, int]],
                    revision: Revision | None) -> None:
        for name, version in held:
            try:
                model = self.service.catalog.get(name, version)
            except ServingError:                              # unloaded since: its entry ages out
                continue
            if not self.service.runs_steps(model):
                continue
            # no unknown-id count here: the learner's next Predict counts its history's
            encoded = self.service.encoder.encode_new(new, model)
            run = self.service.step_runner(model, Deadline.after(self.service.settings.default_deadline_s))
            try:
                result = await self.states.observed(model, learner_key, encoded, run, revision,
                                                    held=self.service.holds_states(model))
            except asyncio.CancelledError:
                raise
            except Exception as exc:                          # never affects the Observe (already answered)
                self.states.cache.discard(name, version, learner_key)
                log.debug("learner-state fill failed: %s", type(exc).__name__)
                result = "failed"
            if result is not None:
                self.metrics.state_fills.labels(model=name, result=result).inc()

    async def maintain(self) -> None:
        return None

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
