"""Next-question recommendation over the prediction pipeline.

Policy ("desirable difficulty"): every candidate gets P(correct) from one rank inference with the
learner's history; candidates are ordered by |P(correct) - target|, closest first, ties kept in
request order; the first `top_k` are returned. target defaults to DEFAULT_TARGET (0.7). With
`exclude_seen`, candidates whose question is already in the learner's history are dropped first:
the request's history, or for a learner_id the events the session store keeps (the newest
store_keep). Bad input: target outside (0, 1) or top_k < 1 is INVALID_ARGUMENT naming the field.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from serving import status_errors as errors
from serving.queries.explain import ExplainService
from serving.core.calls import Deadline, LearnerQuery, PredictQuery
from serving.pipeline.prediction import PredictionService
from serving.sessions.session_service import SessionService

DEFAULT_TARGET = 0.7


@dataclass
class RecommendQuery:
    model: str
    version: int
    learner: LearnerQuery
    target_probability: float | None = None     # None: DEFAULT_TARGET
    top_k: int | None = None                    # None: every candidate
    exclude_seen: bool = False
    explain_top_k: int | None = None            # set (0: the default): explain, serving/queries/explain.py


@dataclass
class Recommendations:
    question_ids: list[int]
    probabilities: list[float]
    model: str
    version: int
    history_used: int
    excluded: int
    prediction_id: str = ""
    explanations: list | None = None           # with explain: serving/queries/explain.py Explanation per recommendation


def order(probabilities: np.ndarray, target: float) -> list[int]:
    """Indices of `probabilities` by |p - target|, closest first, ties in index order."""
    return sorted(range(len(probabilities)), key=lambda i: (abs(float(probabilities[i]) - target), i))


class Recommender:
    def __init__(self, service: PredictionService, sessions: SessionService | None) -> None:
        self.service = service
        self.sessions = sessions

    async def recommend(self, query: RecommendQuery, deadline: Deadline) -> Recommendations:
        target = DEFAULT_TARGET if query.target_probability is None else query.target_probability
        if not (0.0 < target < 1.0) or math.isnan(target):
            raise errors.invalid_argument("target_probability", f"must be in (0, 1), got {target:g}")
        if query.top_k is not None and query.top_k < 1:
            raise errors.invalid_argument("top_k", f"must be >= 1 when set, got {query.top_k}")
        learner = query.learner
        excluded = 0
        if query.exclude_seen and learner.candidate_questions.size:
            keep = ~np.isin(learner.candidate_questions, await self._seen(learner, deadline))
            excluded = int((~keep).sum())
            if excluded == len(keep):
                return Recommendations([], [], query.model, query.version, 0, excluded)
            learner = dataclasses.replace(
                learner, candidate_questions=learner.candidate_questions[keep],
                candidate_skills=learner.candidate_skills[keep],
                candidate_sets=None if learner.candidate_sets is None else learner.candidate_sets[keep])
        if query.explain_top_k is not None:     # the explain graph instead of the rank graph (not tracked)
            got = await ExplainService(self.service).explain(query.model, query.version, learner,
                                                             query.explain_top_k, deadline)
            ranked = order(got.probabilities, target)[:query.top_k]
            return Recommendations([int(learner.candidate_questions[i]) for i in ranked],
                                   [float(got.probabilities[i]) for i in ranked], query.model, got.version,
                                   got.history_used, excluded, explanations=[got.explanations[i] for i in ranked])
        result = await self.service.predict(PredictQuery(query.model, query.version, [learner]), deadline)
        probs = result.learners[0].probabilities
        ranked = order(probs, target)[:query.top_k]
        return Recommendations([int(learner.candidate_questions[i]) for i in ranked],
                               [float(probs[i]) for i in ranked], result.model, result.learners[0].version,
                               result.learners[0].history_used, excluded, result.learners[0].prediction_id)

    async def _seen(self, learner: LearnerQuery, deadline: Deadline) -> np.ndarray:
        if not learner.learner_id:
            return learner.history_questions
        if self.sessions is None:
            raise errors.invalid_argument("learner_id", "this gateway runs without a session store")
        stored = await self.sessions.history(learner.learner_id, self.sessions.settings.store_keep, deadline)
        return stored.questions
