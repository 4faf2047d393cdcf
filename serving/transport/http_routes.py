"""The HTTP mirror's routes, in three groups (health and metrics, the calls, rollout), and the turning
of JSON bodies into PredictQuery / LearnerQuery (serving/core/calls.py) and of results back.

Each group is a RouteGroup of plain functions, added to an app by create_app (http_api.py); what they
answer with (the gateway's endpoints and the query services over them) is the app's RouteContext,
which create_app puts in app.state and each handler gets through `Depends(route_context)`. Route
functions carry no docstring: FastAPI would publish it as the operation's description (their
`summary` says what they do)."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
from fastapi import Depends, FastAPI, Header, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from serving.core.calls import DEFAULT_MAX_SKILLS, Deadline, LearnerQuery, PredictQuery, column_arrays, skill_sets
from serving.status_errors import ServingError, failed_precondition, invalid_argument
from serving.queries.explain import ExplainService
from serving.queries.mastery import MasteryQuery, MasteryService
from serving.queries.recommend import RecommendQuery
from serving.security.audit import audit
from serving.transport.endpoints import Endpoints
from serving.transport.http_models import (ERROR_RESPONSES, AttendedOut, CandidateIn, ExplanationOut, InteractionIn,
                                           LearnerIn, LearnerOut, MasteryIn, MasteryOut, PredictBatchIn,
                                           PredictBatchOut, PredictIn, PredictOut, RecommendationOut, RecommendIn,
                                           RecommendOut, ReportOutcomeIn, ReportOutcomeOut, SkillMasteryOut)

MAX_REQUEST_TIMEOUT_S = 60.0  # X-Request-Timeout beyond this is capped to it


class RouteGroup:
    """Routes declared with FastAPI's decorator arguments (`@group.get(path, ...)`), added to an app by
    `add_to` as that app's own routes (app.add_api_route: what `@app.get` does)."""

    def __init__(self) -> None:
        self.routes: list[tuple[str, Callable, list[str], dict[str, Any]]] = []

    def get(self, path: str, **options: Any) -> Callable[[Callable], Callable]:
        return self._route(path, "GET", options)

    def post(self, path: str, **options: Any) -> Callable[[Callable], Callable]:
        return self._route(path, "POST", options)

    def put(self, path: str, **options: Any) -> Callable[[Callable], Callable]:
        return self._route(path, "PUT", options)

    def add_to(self, app: FastAPI) -> None:
        for path, endpoint, methods, options in self.routes:
            app.add_api_route(path, endpoint, methods=methods, **options)

    def _route(self, path: str, method: str, options: dict[str, Any]) -> Callable[[Callable], Callable]:
        def record(endpoint: Callable) -> Callable:
            self.routes.append((path, endpoint, [method], options))
            return endpoint
        return record


class RouteContext:
    """What the routes of one app answer with: the gateway's endpoints, and the query services over them."""

    def __init__(self, endpoints: Endpoints) -> None:
        self.endpoints = endpoints
        self.service = endpoints.service
        self.settings, self.metrics = self.service.settings, self.service.metrics
        self.max_skills = self.settings.max_skills_per_interaction
        self.masteries = MasteryService(self.service)
        self.explainer = ExplainService(self.service)


def route_context(request: Request) -> RouteContext:
    """The app's RouteContext (a FastAPI dependency)."""
    return request.app.state.route_context


def call_deadline(x_request_timeout: str | None = Header(None),
                  context: RouteContext = Depends(route_context)) -> Deadline:
    """The call's deadline: settings.default_deadline_s, or the X-Request-Timeout header (a FastAPI dependency)."""
    try:
        return parse_deadline(x_request_timeout, context.settings.default_deadline_s)
    except ServingError as exc:
        context.metrics.errors.labels(code=exc.code_name).inc()
        raise


def parse_deadline(header: str | None, default_s: float) -> Deadline:
    """The call's deadline; INVALID_ARGUMENT for a bad X-Request-Timeout header."""
    if header is None:
        return Deadline.after(default_s)
    try:
        seconds = float(header)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise invalid_argument("X-Request-Timeout", f"must be a positive number of seconds, got {header[:32]!r}")
    return Deadline.after(min(seconds, MAX_REQUEST_TIMEOUT_S))


# -- health and metrics ----------------------------------------------------------------------------
health_routes = RouteGroup()


@health_routes.get("/livez", summary="the process is up")
async def livez() -> dict[str, str]:
    return {"status": "live"}


@health_routes.get("/readyz", summary="Triton and at least one model are ready",
                   responses={503: {"description": "not ready"}})
async def readyz(context: RouteContext = Depends(route_context)) -> JSONResponse:
    endpoints, backend = context.endpoints, context.service.backend
    ready = endpoints.health.ready
    body = {"ready": ready, **backend.describe(), "stopping": endpoints.health.stopping,
            "models": backend.ready_models()}
    if endpoints.sessions is not None:
        body["store"] = {"kind": endpoints.sessions.store.kind, "up": endpoints.sessions.up}
    return JSONResponse(status_code=200 if ready else 503, content=body)


@health_routes.get("/metrics", summary="Prometheus metrics of the gateway", response_class=PlainTextResponse)
async def prometheus(context: RouteContext = Depends(route_context)) -> PlainTextResponse:
    return PlainTextResponse(generate_latest(context.metrics.registry), media_type=CONTENT_TYPE_LATEST)


# -- the calls: JSON mirrors of the gRPC methods ---------------------------------------------------
call_routes = RouteGroup()


@call_routes.post("/v1/predict", response_model=PredictOut, responses=ERROR_RESPONSES,
                  summary="P(correct) for each candidate question of one learner")
async def predict(body: PredictIn, deadline: Deadline = Depends(call_deadline),
                  context: RouteContext = Depends(route_context)) -> PredictOut:
    query = PredictQuery(model=body.model, version=body.version,
                         learners=[learner_query(body, "", context.max_skills)])
    if body.explain is not None:              # the explain graph instead of the rank graph
        got = await context.explainer.explain(body.model, body.version, query.learners[0], body.explain.top_k,
                                              deadline)
        return PredictOut(probabilities=got.probabilities.tolist(), model=body.model, version=got.version,
                          history_used=got.history_used, explanations=[explanation(e) for e in got.explanations])
    result = await context.service.predict(query, deadline)
    learner = result.learners[0]
    return PredictOut(probabilities=learner.probabilities.tolist(), model=result.model,
                      version=learner.version, history_used=learner.history_used,
                      prediction_id=learner.prediction_id)


@call_routes.post("/v1/predict_batch", response_model=PredictBatchOut, responses=ERROR_RESPONSES,
                  summary="P(correct) for the candidates of several learners")
async def predict_batch(body: PredictBatchIn, deadline: Deadline = Depends(call_deadline),
                        context: RouteContext = Depends(route_context)) -> PredictBatchOut:
    learners = [learner_query(learner, f"learners[{index}].", context.max_skills)
                for index, learner in enumerate(body.learners)]
    query = PredictQuery(model=body.model, version=body.version, batch=True, learners=learners)
    result = await context.service.predict(query, deadline)
    return PredictBatchOut(results=[LearnerOut(probabilities=r.probabilities.tolist(),
                                               history_used=r.history_used, version=r.version,
                                               prediction_id=r.prediction_id) for r in result.learners],
                           model=result.model, version=result.version)


@call_routes.post("/v1/recommend", response_model=RecommendOut, responses=ERROR_RESPONSES,
                  summary="candidates ordered by |P(correct) - target_probability| (default 0.7), closest first")
async def recommend(body: RecommendIn, deadline: Deadline = Depends(call_deadline),
                    context: RouteContext = Depends(route_context)) -> RecommendOut:
    query = RecommendQuery(body.model, body.version, learner_query(body, "", context.max_skills),
                           body.target_probability, body.top_k, body.exclude_seen,
                           body.explain.top_k if body.explain is not None else None)
    result = await context.endpoints.recommender.recommend(query, deadline)
    explained = result.explanations or [None] * len(result.question_ids)
    recommendations = [RecommendationOut(question_id=question, probability=probability,
                                         explanation=explanation(why) if why else None)
                       for question, probability, why in zip(result.question_ids, result.probabilities, explained)]
    return RecommendOut(recommendations=recommendations, model=result.model, version=result.version,
                        history_used=result.history_used, excluded=result.excluded,
                        prediction_id=result.prediction_id)


@call_routes.post("/v1/mastery", response_model=MasteryOut, responses=ERROR_RESPONSES,
                  summary="P(correct) per skill for one learner (reads only, tracks nothing)")
async def mastery(body: MasteryIn, deadline: Deadline = Depends(call_deadline),
                  context: RouteContext = Depends(route_context)) -> MasteryOut:
    learner = learner_query(body, "", context.max_skills, candidates=[])
    query = MasteryQuery(body.model, body.version, learner, np.array(body.skill_ids, dtype=np.int64))
    result = await context.masteries.mastery(query, deadline)
    return MasteryOut(skills=[SkillMasteryOut(skill_id=skill, probability=probability) for skill, probability in
                              zip(result.skill_ids.tolist(), result.probabilities.tolist())],
                      model=result.model, version=result.version, history_used=result.history_used)


@call_routes.post("/v1/report_outcome", response_model=ReportOutcomeOut, responses=ERROR_RESPONSES,
                  summary="record the answer to a question a stateless predict scored")
async def report_outcome(body: ReportOutcomeIn, deadline: Deadline = Depends(call_deadline),
                         context: RouteContext = Depends(route_context)) -> ReportOutcomeOut:
    sessions = context.endpoints.sessions
    if sessions is None:
        raise failed_precondition("this gateway does not track outcomes (it runs without a session store)")
    return ReportOutcomeOut(recorded=await sessions.report_outcome(
        body.prediction_id, body.question_id, body.correct, deadline))


# -- rollout ---------------------------------------------------------------------------------------
rollout_routes = RouteGroup()


@rollout_routes.get("/v1/rollout", summary="the rollout policy in force and the outcomes per version")
async def rollout(context: RouteContext = Depends(route_context)) -> dict[str, Any]:
    return {**context.endpoints.policy.status(), "quality": context.metrics.quality.summary()}


@rollout_routes.put("/v1/rollout/{model}", responses=ERROR_RESPONSES,
                    summary="set one model's rollout policy (written to the watched policy file)")
async def set_rollout(model: str, body: dict[str, Any], context: RouteContext = Depends(route_context)
                      ) -> dict[str, Any]:
    policy = await context.endpoints.policy.change(model, body)
    audit("rollout_change", model=model[:128], policy=policy)
    return {"model": model, "policy": policy}


# -- JSON bodies -> queries ------------------------------------------------------------------------
def learner_query(body: PredictIn | LearnerIn | RecommendIn | MasteryIn, prefix: str = "",
                  max_skills: int = DEFAULT_MAX_SKILLS, candidates: list[CandidateIn] | None = None) -> LearnerQuery:
    """One learner's query; `history_columns` and skill sets as on gRPC (serving/core/calls.py);
    `candidates`: instead of the body's (Mastery has none)."""
    candidates = body.candidates if candidates is None else candidates
    if body.history_columns is not None:
        columns = body.history_columns
        (history_questions, history_skills, history_correct,
         history_sets) = column_arrays(columns.question_ids, columns.skill_ids, columns.correct,
                                       f"{prefix}history_columns", len(body.history), columns.skill_lengths,
                                       columns.skill_values, max_skills)
    else:
        history_questions = np.array([i.question_id for i in body.history], dtype=np.int64)
        history_correct = np.array([i.correct for i in body.history], dtype=np.int64)
        history_skills, history_sets = skill_rows(body.history, f"{prefix}history", max_skills)
    candidate_skills, candidate_sets = skill_rows(candidates, f"{prefix}candidates", max_skills)
    candidate_questions = np.array([c.question_id for c in candidates], dtype=np.int64)
    return LearnerQuery(history_questions, history_skills, history_correct, candidate_questions, candidate_skills,
                        body.learner_id, history_sets, candidate_sets)


def skill_rows(items: list[InteractionIn] | list[CandidateIn], field: str, max_skills: int):
    """`skill_id` / `skill_ids` of each item -> (rows [N, K], as_sets), serving/core/calls.py skill_sets."""
    return skill_sets(np.array([i.skill_id or 0 for i in items], dtype=np.int64),
                      np.array([i.skill_id is not None for i in items], dtype=bool),
                      [i.skill_ids for i in items] if any(i.skill_ids for i in items) else None, field, max_skills)


def explanation(explained) -> ExplanationOut:
    """An explanation of the query services (serving/queries/explain.py) as JSON."""
    return ExplanationOut(attended=[AttendedOut(**vars(a)) for a in explained.attended],
                          head_weights=explained.head_weights)
