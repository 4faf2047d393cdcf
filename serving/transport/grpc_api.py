"""The gRPC transport: `KnowledgeTracingServicer` adapts routerkt.v1 messages to the serving core
(serving/pipeline/prediction.py) and back. Protobuf stops here: each learner's repeated fields become numpy
arrays in one pass (serving/core/calls.py). Every method is registered through one wrapper
(`_handler`): it refuses an undecodable body, gives the handler the call's Deadline, and maps a
ServingError to status code + message, with the offending field in the trailing metadata key
`routerkt-field`; the handlers themselves hold no error handling.

Decoding is the gateway's own (`add_to_server`): a body that is not a valid message of the
method's request type (garbage, truncated, invalid UTF-8 in a string field) is answered
INVALID_ARGUMENT "the request body is not a valid <Type>", counted in
routerkt_undecodable_requests_total{method} and logged at most once per LOG_EVERY_S, never with a
traceback (grpc's own deserializer would answer UNKNOWN and log one per call).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Sequence

import grpc
import numpy as np

from serving import status_errors as errors
from serving.api import knowledge_tracing_pb2 as pb
from serving.status_errors import ServingError
from serving.transport.endpoints import Endpoints
from serving.queries.explain import ExplainService, Explanation
from serving.queries.mastery import MasteryQuery, MasteryService
from serving.queries.recommend import RecommendQuery
from serving.core.calls import (DEFAULT_MAX_SKILLS, Deadline, LearnerQuery, PredictQuery, PredictResult, column_arrays,
                              skill_sets)
from serving.security.guard import Guard
from serving.security.scopes import grpc_scope
from serving.sessions.events import ObserveQuery, timestamp_array
from serving.sessions.session_service import SessionService


log = logging.getLogger("routerkt.gateway.grpc")

SERVICE = pb.DESCRIPTOR.services_by_name["KnowledgeTracingService"]
LOG_EVERY_S = 10.0
# A PredictBatch with more interactions + candidates than this is converted to arrays in a worker
# thread: a maximal one (64 x 1,064) took 130 ms of Python that would otherwise stall every other
# call on the event loop (`routerkt bench fairness`, docs/benchmarks.md).
OFFLOAD_INTERACTIONS = 4096


class Undecodable:
    """What the gateway's deserializer returns for a body that does not parse."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name


def _decoder(message_type, on_failure):
    def decode(data: bytes):
        try:
            return message_type.FromString(data)
        except Exception:                      # DecodeError, invalid UTF-8, ...: never a traceback
            on_failure()
            return Undecodable(message_type.DESCRIPTOR.name)
    return decode


def add_to_server(servicer: "KnowledgeTracingServicer", server) -> None:
    """Register the service's methods with the gateway's safe decoding (see the module docstring) on `server`
    (a grpc.aio.Server, or serving/metrics' CountingRegistry in front of one), as registered methods."""
    handlers = {}
    for method in SERVICE.methods:
        request_type = getattr(pb, method.input_type.name)
        response_type = getattr(pb, method.output_type.name)
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            _handler(getattr(servicer, method.name), servicer.default_deadline_s, servicer.max_deadline_s,
                     servicer.guard, f"/{SERVICE.full_name}/{method.name}", servicer.service.metrics),
            request_deserializer=_decoder(request_type, servicer.undecodable(method.name)),
            response_serializer=response_type.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),))
    server.add_registered_method_handlers(SERVICE.full_name, handlers)


def learner_query(history: Sequence, candidates: Sequence, learner_id: str = "",
                  columns: pb.HistoryColumns | None = None, prefix: str = "",
                  max_skills: int = DEFAULT_MAX_SKILLS) -> LearnerQuery:
    """Repeated Interaction / Candidate messages (or HistoryColumns) -> a LearnerQuery of raw-id
    arrays. Messages: one pass over each list, ~1.4 us per interaction plus ~0.35 us to see whether
    it has `skill_ids` (whose ids are read in a second pass only when some message has them);
    columns: no object per interaction (np.fromiter over each packed column). `prefix` ("" or
    "learners[i].") names the learner in errors; `max_skills`: the most skills one set may have
    (Settings.max_skills_per_interaction)."""
    history_sets = None
    candidate_rows = np.array([(q.question_id, q.skill_id, q.HasField("skill_id"), len(q.skill_ids))
                               for q in candidates], dtype=np.int64).reshape(-1, 4)       # [C, 4]
    if columns is not None:
        (history_questions, history_skills, history_correct,
         history_sets) = column_arrays(columns.question_ids, columns.skill_ids, columns.correct,
                                       f"{prefix}history_columns", len(history), columns.skill_lengths,
                                       columns.skill_values, max_skills)
    elif not history:                                     # a Predict by learner_id
        history_questions, history_correct = np.empty(0, np.int64), np.empty(0, np.int64)
        history_skills = np.empty((0, 1), np.int64)
    else:
        history_rows = np.array([(i.question_id, i.skill_id, i.correct, i.HasField("skill_id"), len(i.skill_ids))
                                 for i in history], dtype=np.int64).reshape(-1, 5)        # [H, 5]
        sets = [i.skill_ids for i in history] if history_rows[:, 4].any() else None
        history_skills, history_sets = skill_sets(history_rows[:, 1], history_rows[:, 3].astype(bool), sets,
                                                  f"{prefix}history", max_skills)
        history_questions, history_correct = history_rows[:, 0].copy(), history_rows[:, 2].copy()
    sets = [q.skill_ids for q in candidates] if candidate_rows[:, 3].any() else None
    candidate_skills, candidate_sets = skill_sets(candidate_rows[:, 1], candidate_rows[:, 2].astype(bool), sets,
                                                  f"{prefix}candidates", max_skills)
    return LearnerQuery(history_questions=history_questions, history_skills=history_skills,
                        history_correct=history_correct, candidate_questions=candidate_rows[:, 0].copy(),
                        candidate_skills=candidate_skills, learner_id=learner_id,
                        history_sets=history_sets, candidate_sets=candidate_sets)


def _learner(message, prefix: str = "", max_skills: int = DEFAULT_MAX_SKILLS) -> LearnerQuery:
    """A PredictRequest, LearnerRequest or RecommendRequest's learner."""
    columns = message.history_columns if message.HasField("history_columns") else None
    return learner_query(message.history, message.candidates, message.learner_id, columns, prefix, max_skills)


def interactions_in(request: pb.PredictBatchRequest) -> int:
    """History entries plus candidates of a batch request (what converting it costs)."""
    return sum(len(learner.history) + len(learner.history_columns.question_ids) + len(learner.candidates)
               for learner in request.learners)


def predict_query(request: pb.PredictRequest, max_skills: int = DEFAULT_MAX_SKILLS) -> PredictQuery:
    return PredictQuery(model=request.model, version=request.version, learners=[_learner(request, "", max_skills)])


def batch_query(request: pb.PredictBatchRequest, max_skills: int = DEFAULT_MAX_SKILLS) -> PredictQuery:
    return PredictQuery(model=request.model, version=request.version, batch=True,
                        learners=[_learner(l, f"learners[{i}].", max_skills) for i, l in enumerate(request.learners)])


def recommend_query(request: pb.RecommendRequest, max_skills: int = DEFAULT_MAX_SKILLS) -> RecommendQuery:
    return RecommendQuery(
        model=request.model, version=request.version, learner=_learner(request, "", max_skills),
        target_probability=request.target_probability if request.HasField("target_probability") else None,
        top_k=request.top_k if request.HasField("top_k") else None, exclude_seen=request.exclude_seen,
        explain_top_k=request.explain.top_k if request.HasField("explain") else None)


def mastery_query(request: pb.MasteryRequest, max_skills: int = DEFAULT_MAX_SKILLS) -> MasteryQuery:
    columns = request.history_columns if request.HasField("history_columns") else None
    learner = learner_query(request.history, (), request.learner_id, columns, "", max_skills)
    return MasteryQuery(model=request.model, version=request.version, learner=learner,
                        skill_ids=np.fromiter(request.skill_ids, dtype=np.int64, count=len(request.skill_ids)))


def observe_query(request: pb.ObserveRequest, max_skills: int = DEFAULT_MAX_SKILLS) -> ObserveQuery:
    events = request.events
    n = len(events)
    sets = [e.skill_ids for e in events] if any(len(e.skill_ids) for e in events) else None
    skills, as_sets = skill_sets(np.fromiter((e.skill_id for e in events), dtype=np.int64, count=n),
                                 np.fromiter((e.HasField("skill_id") for e in events), dtype=bool, count=n),
                                 sets, "events", max_skills)
    return ObserveQuery(
        learner_id=request.learner_id, event_ids=[e.event_id for e in events],
        questions=np.fromiter((e.question_id for e in events), dtype=np.int64, count=n),
        skills=skills, skill_sets=as_sets,
        correct=np.fromiter((e.correct for e in events), dtype=np.int64, count=n),
        timestamps=timestamp_array(np.fromiter((e.timestamp_ms for e in events), dtype=np.int64, count=n),
                                   np.fromiter((e.HasField("timestamp_ms") for e in events), dtype=bool, count=n)))


def predict_response(result: PredictResult) -> pb.PredictResponse:
    learner = result.learners[0]
    return pb.PredictResponse(probabilities=learner.probabilities.tolist(), model=result.model,
                              version=learner.version, history_used=learner.history_used,
                              prediction_id=learner.prediction_id)


def explanation_pb(explanation: Explanation) -> pb.CandidateExplanation:
    return pb.CandidateExplanation(
        attended=[pb.AttendedInteraction(position=a.position, question_id=a.question_id, skill_ids=a.skill_ids,
                                         correct=a.correct, weight=a.weight, head_attention=a.head_attention)
                  for a in explanation.attended], head_weights=explanation.head_weights)


def batch_response(result: PredictResult) -> pb.PredictBatchResponse:
    return pb.PredictBatchResponse(
        results=[pb.LearnerResult(probabilities=l.probabilities.tolist(), history_used=l.history_used,
                                  version=l.version, prediction_id=l.prediction_id)
                 for l in result.learners], model=result.model, version=result.version)


class KnowledgeTracingServicer:
    """gRPC adapter: one method per RPC, (request, deadline) -> response; see `_handler`."""

    def __init__(self, endpoints: Endpoints) -> None:
        self.service = endpoints.service
        self.sessions = endpoints.sessions
        self.recommender = endpoints.recommender
        self.mastery = MasteryService(endpoints.service)
        self.explainer = ExplainService(endpoints.service)
        self.default_deadline_s = self.service.settings.default_deadline_s
        self.max_skills = self.service.settings.max_skills_per_interaction
        self.max_deadline_s = self.service.settings.max_deadline_s
        self.guard = endpoints.guard
        self._last_log = -LOG_EVERY_S

    def undecodable(self, method: str):
        """The callback counting (and rarely logging) an undecodable body of `method`."""
        counter = self.service.metrics.undecodable.labels(method=method)

        def count() -> None:
            counter.inc()
            if time.monotonic() - self._last_log >= LOG_EVERY_S:
                self._last_log = time.monotonic()
                log.warning("undecodable %s request bodies answered INVALID_ARGUMENT (counted in "
                            "routerkt_undecodable_requests_total; logged at most every %.0fs)", method, LOG_EVERY_S)
        return count

    async def Predict(self, request: pb.PredictRequest, deadline: Deadline) -> pb.PredictResponse:
        if request.HasField("explain"):                  # the explain graph instead of the rank graph
            query = predict_query(request, self.max_skills)
            got = await self.explainer.explain(query.model, query.version, query.learners[0], request.explain.top_k,
                                               deadline)
            return pb.PredictResponse(probabilities=got.probabilities.tolist(), model=query.model, version=got.version,
                                      history_used=got.history_used,
                                      explanations=[explanation_pb(e) for e in got.explanations])
        return predict_response(await self.service.predict(predict_query(request, self.max_skills), deadline))

    async def PredictBatch(self, request: pb.PredictBatchRequest, deadline: Deadline) -> pb.PredictBatchResponse:
        if interactions_in(request) > OFFLOAD_INTERACTIONS:      # keep the event loop for small calls
            query = await asyncio.to_thread(batch_query, request, self.max_skills)
        else:
            query = batch_query(request, self.max_skills)
        return batch_response(await self.service.predict(query, deadline))

    async def Recommend(self, request: pb.RecommendRequest, deadline: Deadline) -> pb.RecommendResponse:
        result = await self.recommender.recommend(recommend_query(request, self.max_skills), deadline)
        return pb.RecommendResponse(
            recommendations=[pb.Recommendation(question_id=q, probability=p,
                                               explanation=explanation_pb(e) if e is not None else None)
                             for q, p, e in zip(result.question_ids, result.probabilities,
                                                result.explanations or [None] * len(result.question_ids))],
            model=result.model, version=result.version, history_used=result.history_used, excluded=result.excluded,
            prediction_id=result.prediction_id)

    async def Mastery(self, request: pb.MasteryRequest, deadline: Deadline) -> pb.MasteryResponse:
        result = await self.mastery.mastery(mastery_query(request, self.max_skills), deadline)
        return pb.MasteryResponse(
            skills=[pb.SkillMastery(skill_id=s, probability=p)
                    for s, p in zip(result.skill_ids.tolist(), result.probabilities.tolist())],
            model=result.model, version=result.version, history_used=result.history_used)

    async def Observe(self, request: pb.ObserveRequest, deadline: Deadline) -> pb.ObserveResponse:
        result = await self._sessions().observe(observe_query(request, self.max_skills), deadline)
        return pb.ObserveResponse(stored=result.stored, duplicates=result.duplicates,
                                  history_length=result.history_length)

    async def ForgetLearner(self, request: pb.ForgetLearnerRequest, deadline: Deadline) -> pb.ForgetLearnerResponse:
        existed, deleted = await self._sessions().forget(request.learner_id, deadline)
        return pb.ForgetLearnerResponse(existed=existed, deleted=deleted)

    async def ReportOutcome(self, request: pb.ReportOutcomeRequest, deadline: Deadline) -> pb.ReportOutcomeResponse:
        sessions = self._sessions("does not track outcomes (it runs without a session store)")
        recorded = await sessions.report_outcome(request.prediction_id, request.question_id, request.correct, deadline)
        return pb.ReportOutcomeResponse(recorded=recorded)

    def _sessions(self, missing: str = "runs without a session store") -> SessionService:
        if self.sessions is None:
            raise errors.failed_precondition(f"this gateway {missing}")
        return self.sessions


def _handler(method, default_deadline_s: float, max_deadline_s: float, guard: Guard, full_name: str, metrics):
    """The one frame of every RPC: the caller's key and scope (serving/security/; before the body
    is looked at: an undecodable body without a key is UNAUTHENTICATED), decoded body, the call's
    deadline (none: the default; beyond max_deadline_s: capped, never expired), ServingError ->
    status, counted here once (routerkt_errors_total{code}); anything else is logged and INTERNAL."""
    scope = grpc_scope(full_name)

    async def handle(request, context: grpc.aio.ServicerContext):
        try:
            guard.check_grpc(scope, context, full_name)
            if isinstance(request, Undecodable):
                raise errors.invalid_argument("body", f"the request body is not a valid {request.type_name}")
            remaining = context.time_remaining()
            return await method(request, Deadline.after(default_deadline_s if remaining is None
                                                        else min(remaining, max_deadline_s)))
        except ServingError as exc:
            error = exc
        except (asyncio.CancelledError, GeneratorExit, grpc.aio.AbortError):
            raise
        except Exception:
            log.exception("unexpected error in %s", full_name)
            error = errors.internal()
        metrics.errors.labels(code=error.code_name).inc()
        if error.field:
            context.set_trailing_metadata(((errors.FIELD_METADATA_KEY, error.field),))
        await context.abort(error.code, error.message)
    handle.__name__ = method.__name__
    return handle
