"""ShadowScoring: a shadow version scores a Predict's learners again in the background, for the sink only."""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from serving.core.calls import Deadline, LearnerPrediction, PredictQuery, PredictResult
from serving.core.catalog import ModelVersion
from serving.core.validation import LearnerInput
from serving.metrics import Metrics
from serving.pipeline.parts import Answer, PredictionRecord, PredictionSink, Route
from serving.settings import Settings

log = logging.getLogger("routerkt.gateway.service")

Answers = Callable[[list[LearnerInput], list[ModelVersion], Deadline], Awaitable[list[Answer]]]


class ShadowScoring:
    """Learners whose route names a shadow version are scored again by it after the answer (at most
    max_shadow_inflight such tasks; beyond that skipped and counted); a shadow never affects a caller."""

    def __init__(self, settings: Settings, metrics: Metrics, sink: PredictionSink, answers: Answers) -> None:
        self.settings = settings
        self.metrics = metrics
        self.sink = sink
        self.answers = answers                      # the pipeline's answers of learners, each by its model
        self._tasks: set[asyncio.Task] = set()

    def start(self, query: PredictQuery, learners: list[LearnerInput], routes: list[Route], ids: list[str]) -> None:
        """Score the learners whose route has a shadow, in the background."""
        picked = [i for i, r in enumerate(routes) if r.shadow is not None]
        if not picked:
            return
        shadow = routes[picked[0]].shadow
        if len(self._tasks) >= self.settings.max_shadow_inflight:
            self.metrics.shadow_skipped.labels(model=shadow.name).inc(len(picked))
            return
        task = asyncio.create_task(self._score(query, [learners[i] for i in picked],
                                               [routes[i].shadow for i in picked], [ids[i] for i in picked],
                                               [query.learners[i] for i in picked]))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _score(self, query: PredictQuery, learners: list[LearnerInput], models: list[ModelVersion],
                     ids: list[str], raw: list) -> None:
        try:
            deadline = Deadline.after(self.settings.default_deadline_s)
            answers = await self.answers(learners, models, deadline)
        except asyncio.CancelledError:
            raise
        except Exception as exc:                   # a shadow never affects a caller: count, log briefly
            self.metrics.shadow_failures.labels(model=models[0].name).inc()
            log.debug("shadow scoring failed: %s", type(exc).__name__)
            return
        result = PredictResult(model=models[0].name, version=0,
                               learners=[LearnerPrediction(p, used, m.version, i, key)
                                         for (p, used, key), m, i in zip(answers, models, ids)])
        self.sink.on_prediction(PredictionRecord(query=PredictQuery(query.model, 0, raw, query.batch), result=result,
                                                 shadow=True))

    async def close(self) -> None:
        """Cancel shadow scorings still running (shutdown)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
