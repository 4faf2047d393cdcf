"""The gRPC transport: `KnowledgeTracingServicer` adapts routerkt.v1 messages to the serving core
(serving/service.py) and back. Protobuf stops here: each learner's repeated fields become numpy
arrays in one pass (serving/requests.py), errors become status code + message, and the offending
field travels in the trailing metadata key `routerkt-field`.
"""
from __future__ import annotations

from typing import Sequence

import grpc
import numpy as np

from serving import errors
from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.errors import ServingError
from serving.requests import Deadline, LearnerQuery, PredictQuery, PredictResult, skill_array
from serving.service import PredictionService
from serving.sessions.events import ObserveQuery, timestamp_array
from serving.sessions.service import SessionService


def learner_query(history: Sequence, candidates: Sequence, learner_id: str = "") -> LearnerQuery:
    """Repeated Interaction / Candidate messages -> a LearnerQuery of raw-id arrays."""
    nh, nc = len(history), len(candidates)
    return LearnerQuery(
        history_questions=np.fromiter((i.question_id for i in history), dtype=np.int64, count=nh),
        history_skills=skill_array(np.fromiter((i.skill_id for i in history), dtype=np.int64, count=nh),
                                   np.fromiter((i.HasField("skill_id") for i in history), dtype=bool, count=nh)),
        history_correct=np.fromiter((i.correct for i in history), dtype=np.int64, count=nh),
        candidate_questions=np.fromiter((c.question_id for c in candidates), dtype=np.int64, count=nc),
        candidate_skills=skill_array(np.fromiter((c.skill_id for c in candidates), dtype=np.int64, count=nc),
                                     np.fromiter((c.HasField("skill_id") for c in candidates), dtype=bool, count=nc)),
        learner_id=learner_id)


def predict_query(request: pb.PredictRequest) -> PredictQuery:
    return PredictQuery(model=request.model, version=request.version,
                        learners=[learner_query(request.history, request.candidates, request.learner_id)])


def batch_query(request: pb.PredictBatchRequest) -> PredictQuery:
    return PredictQuery(model=request.model, version=request.version, batch=True,
                        learners=[learner_query(l.history, l.candidates, l.learner_id) for l in request.learners])


def observe_query(request: pb.ObserveRequest) -> ObserveQuery:
    events = request.events
    n = len(events)
    return ObserveQuery(
        learner_id=request.learner_id, event_ids=[e.event_id for e in events],
        questions=np.fromiter((e.question_id for e in events), dtype=np.int64, count=n),
        skills=skill_array(np.fromiter((e.skill_id for e in events), dtype=np.int64, count=n),
                           np.fromiter((e.HasField("skill_id") for e in events), dtype=bool, count=n)),
        correct=np.fromiter((e.correct for e in events), dtype=np.int64, count=n),
        timestamps=timestamp_array(np.fromiter((e.timestamp_ms for e in events), dtype=np.int64, count=n),
                                   np.fromiter((e.HasField("timestamp_ms") for e in events), dtype=bool, count=n)))


def predict_response(result: PredictResult) -> pb.PredictResponse:
    learner = result.learners[0]
    return pb.PredictResponse(probabilities=learner.probabilities.tolist(), model=result.model,
                              version=result.version, history_used=learner.history_used)


def batch_response(result: PredictResult) -> pb.PredictBatchResponse:
    return pb.PredictBatchResponse(
        results=[pb.LearnerResult(probabilities=l.probabilities.tolist(), history_used=l.history_used)
                 for l in result.learners], model=result.model, version=result.version)


class KnowledgeTracingServicer(pb_grpc.KnowledgeTracingServiceServicer):
    """gRPC adapter: deadline from the call, ServingError -> status code + message + field."""

    def __init__(self, service: PredictionService, sessions: SessionService | None = None) -> None:
        self.service = service
        self.sessions = sessions

    async def Predict(self, request: pb.PredictRequest, context: grpc.aio.ServicerContext) -> pb.PredictResponse:
        try:
            result = await self.service.predict(predict_query(request), self._deadline(context))
        except ServingError as exc:
            await _abort(context, exc)
            raise AssertionError("unreachable") from None
        return predict_response(result)

    async def PredictBatch(self, request: pb.PredictBatchRequest,
                           context: grpc.aio.ServicerContext) -> pb.PredictBatchResponse:
        try:
            result = await self.service.predict(batch_query(request), self._deadline(context))
        except ServingError as exc:
            await _abort(context, exc)
            raise AssertionError("unreachable") from None
        return batch_response(result)

    async def Observe(self, request: pb.ObserveRequest, context: grpc.aio.ServicerContext) -> pb.ObserveResponse:
        try:
            result = await self._sessions().observe(observe_query(request), self._deadline(context))
        except ServingError as exc:
            await _abort(context, exc)
            raise AssertionError("unreachable") from None
        return pb.ObserveResponse(stored=result.stored, duplicates=result.duplicates,
                                  history_length=result.history_length)

    async def ForgetLearner(self, request: pb.ForgetLearnerRequest,
                            context: grpc.aio.ServicerContext) -> pb.ForgetLearnerResponse:
        try:
            existed, deleted = await self._sessions().forget(request.learner_id, self._deadline(context))
        except ServingError as exc:
            await _abort(context, exc)
            raise AssertionError("unreachable") from None
        return pb.ForgetLearnerResponse(existed=existed, deleted=deleted)

    def _sessions(self) -> SessionService:
        if self.sessions is None:
            raise errors.failed_precondition("this gateway runs without a session store")
        return self.sessions

    def _deadline(self, context: grpc.aio.ServicerContext) -> Deadline:
        remaining = context.time_remaining()
        return Deadline.after(self.service.settings.default_deadline_s if remaining is None else remaining)


async def _abort(context: grpc.aio.ServicerContext, exc: ServingError) -> None:
    if exc.field:
        context.set_trailing_metadata(((errors.FIELD_METADATA_KEY, exc.field),))
    await context.abort(exc.code, exc.message)
