"""The gateway's HTTP side (FastAPI, served by uvicorn on the gRPC server's event loop):

- GET  /metrics            Prometheus text format (this gateway's registry only; Triton's metrics
                            stay on Triton's own port)
- GET  /livez              200 while the process runs
- GET  /readyz             200 only when Triton and at least one model are ready (503 otherwise,
                            and from the start of shutdown on)
- POST /v1/predict         JSON mirror of Predict
- POST /v1/predict_batch   JSON mirror of PredictBatch
- POST /v1/recommend       JSON mirror of Recommend
- POST /v1/report_outcome  JSON mirror of ReportOutcome
- GET  /v1/rollout         the rollout policy in force, a refused file's error, outcome counts
- PUT  /v1/rollout/{model} set one model's rollout (the policy file's JSON for it; admin, audited)
- GET  /openapi.json, /docs

The JSON calls run the same PredictionService as gRPC (same validation, limits, in-flight slots):
this module only turns JSON bodies into PredictQuery (serving/core/calls.py) and results back.
Errors are {"error": {"code": <gRPC code name>, "message", "field"}} with HTTP 400 (INVALID_ARGUMENT,
also for malformed JSON / wrong types), 401 (no valid API key; checked before the body is read, so
a malformed body without a key is 401), 403 (the key lacks the route's scope:
serving/security/scopes.py), 404 (NOT_FOUND), 413 (body over the size limit), 429
(RESOURCE_EXHAUSTED; also failed keys over the limit of serving/security/failures.py), 503
(UNAVAILABLE), 504 (DEADLINE_EXCEEDED), 500 (INTERNAL): serving/errors.py's table, with its HTTP
refinements (408, 413, 405). Every error is counted once, where it is rendered (`_error`). The deadline is
settings.default_deadline_s unless the `X-Request-Timeout` header gives one in seconds (capped at
MAX_REQUEST_TIMEOUT_S, 60). Input is strict: JSON integers only (no bool, string or float for an id
or `correct`), text without lone surrogates, a body of at most 4x max_message_bytes also when
chunked (413), arriving within settings.http_body_timeout_s (408).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import numpy as np
from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from serving import errors
from serving.errors import ServingError, failed_precondition, invalid_argument
from serving.transport.http_models import (ERROR_RESPONSES, AttendedOut, CandidateIn, ExplanationOut, InteractionIn,
                                           LearnerIn, LearnerOut, MasteryIn, MasteryOut, PredictBatchIn,
                                           PredictBatchOut, PredictIn, PredictOut, RecommendationOut, RecommendIn,
                                           RecommendOut, ReportOutcomeIn, ReportOutcomeOut, SkillMasteryOut)
from serving.transport.endpoints import Endpoints
from serving.queries.explain import ExplainService
from serving.queries.mastery import MasteryQuery, MasteryService
from serving.queries.recommend import RecommendQuery
from serving.core.calls import DEFAULT_MAX_SKILLS, Deadline, LearnerQuery, PredictQuery, column_arrays, skill_sets
from serving.security.audit import audit
from serving.security.failures import peer_address
from serving.security.scopes import http_scope

log = logging.getLogger("routerkt.gateway.http")
DISCONNECT_LOG_EVERY_S = 10.0     # a client hanging up before its answer: counted, logged this rarely
JSON_SIZE_FACTOR = 4          # a JSON body may be this many times settings.max_message_bytes
MAX_REQUEST_TIMEOUT_S = 60.0  # X-Request-Timeout beyond this is capped to it


class BodyGuard:
    """ASGI middleware: reads a request body completely before the app sees it, refusing one over
    `max_bytes` (413, chunked or not) and one that does not arrive within `read_timeout_s` (408: a
    Content-Length larger than the body, a slow client). Bodies of GET/HEAD pass through."""

    def __init__(self, app, max_bytes: int, read_timeout_s: float, metrics) -> None:
        self.app, self.max_bytes, self.read_timeout_s, self.metrics = app, max_bytes, read_timeout_s, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.read_timeout_s
        chunks, size = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.001))
            except asyncio.TimeoutError:
                await self._reject(scope, receive, send, errors.body_timeout(self.read_timeout_s))
                return
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await self._reject(scope, receive, send, errors.body_too_large(self.max_bytes))
                return
            if not message.get("more_body", False):
                break
        pending = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay():
            return pending.pop() if pending else await receive()
        await self.app(scope, replay, send)

    async def _reject(self, scope, receive, send, error: ServingError) -> None:
        self.metrics.http_requests.labels(handler="other", status=str(error.http_status)).inc()
        response = _error(error, self.metrics)
        response.headers["Connection"] = "close"
        await response(scope, receive, send)


class AuthGate:
    """ASGI middleware outside BodyGuard: every route's key and scope (serving/security/scopes.py)
    before any of the body is read or parsed; 401 / 403 (429 over the failure limit,
    serving/security/failures.py), counted in routerkt_errors_total like the calls' own errors. A
    path no route takes goes on (404 / 405 as before); without a keys file everything goes on."""

    def __init__(self, app, guard, router, metrics) -> None:
        self.app, self.guard, self.router, self.metrics = app, guard, router, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not self.guard.enabled:
            await self.app(scope, receive, send)
            return
        route = next((r for r in self.router.routes if r.matches(scope)[0] is Match.FULL), None)
        if route is None:
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        authorization = next((value.decode("latin-1") for name, value in scope.get("headers") or ()
                              if name == b"authorization"), None)
        try:
            self.guard.check(http_scope(method, route.path), authorization,
                             lambda: peer_address((scope.get("client") or ("-",))[0]), "http",
                             f"{method[:8]} {route.path}")
        except ServingError as exc:
            scope["route"] = route                       # the request counter names the route
            response = _error(exc, self.metrics)
            if method not in ("GET", "HEAD"):            # its body stays unread: no reuse of the connection
                response.headers["Connection"] = "close"
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def create_app(endpoints: Endpoints) -> FastAPI:
    """The FastAPI app over a gateway's endpoints. One error mapping for every route: a ServingError
    raised anywhere (the deadline header, the service) becomes the JSON error with its HTTP status."""
    service, sessions, recommender = endpoints.service, endpoints.sessions, endpoints.recommender
    masteries = MasteryService(service)
    explainer = ExplainService(service)
    settings, metrics = service.settings, service.metrics
    max_skills = settings.max_skills_per_interaction
    guard = endpoints.guard

    app = FastAPI(title="RouterKT gateway", version="1",
                  description="JSON mirror of routerkt.v1.KnowledgeTracingService, plus health and metrics.")
    last_disconnect_log = [-DISCONNECT_LOG_EVERY_S]

    app.add_middleware(BodyGuard, max_bytes=settings.max_message_bytes * JSON_SIZE_FACTOR,
                       read_timeout_s=settings.http_body_timeout_s, metrics=metrics)
    app.add_middleware(AuthGate, guard=guard, router=app.router, metrics=metrics)    # outside BodyGuard

    @app.middleware("http")
    async def count(request: Request, call_next):
        try:
            response = await call_next(request)
        except RuntimeError as exc:               # "No response returned.": the client hung up first
            if str(exc) != "No response returned.":     # (BodyGuard answers nothing to a client gone)
                raise
            response = Response(status_code=499)
            if time.monotonic() - last_disconnect_log[0] >= DISCONNECT_LOG_EVERY_S:
                last_disconnect_log[0] = time.monotonic()
                log.info("HTTP clients hung up before their answer (counted as status 499; logged at most "
                         "every %.0fs)", DISCONNECT_LOG_EVERY_S)
        route = request.scope.get("route")
        metrics.http_requests.labels(handler=getattr(route, "path", "other"), status=str(response.status_code)).inc()
        return response

    @app.exception_handler(ServingError)
    async def serving_error(request: Request, exc: ServingError) -> JSONResponse:
        return _error(exc, metrics)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error while answering %s %s", request.method[:8], getattr(
            request.scope.get("route"), "path", "a request"))
        return _error(errors.internal(), metrics)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": ("body",), "msg": "invalid request"}
        return _error(invalid_argument(_field_path(first.get("loc", ())), str(first.get("msg", "invalid value"))),
                      metrics)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """Unknown paths (404) and methods (405) answer in the same error format as everything else."""
        error = (errors.no_such_path() if exc.status_code == 404 else errors.method_not_allowed(request.method)
                 if exc.status_code == 405 else invalid_argument("body", "invalid request"))
        response = _error(error, metrics)
        response.headers.update(exc.headers or {})
        return response

    def call_deadline(x_request_timeout: str | None = Header(None)) -> Deadline:
        """The call's deadline: settings.default_deadline_s, or the X-Request-Timeout header."""
        try:
            return _deadline(x_request_timeout, settings.default_deadline_s)
        except ServingError as exc:
            metrics.errors.labels(code=exc.code_name).inc()
            raise

    @app.get("/livez", summary="the process is up")
    async def livez() -> dict[str, str]:
        return {"status": "live"}

    @app.get("/readyz", summary="Triton and at least one model are ready",
             responses={503: {"description": "not ready"}})
    async def readyz() -> JSONResponse:
        ready = endpoints.health.ready
        body = {"ready": ready, **service.backend.describe(), "stopping": endpoints.health.stopping,
                "models": service.backend.ready_models()}
        if sessions is not None:
            body["store"] = {"kind": sessions.store.kind, "up": sessions.up}
        return JSONResponse(status_code=200 if ready else 503, content=body)

    @app.get("/metrics", summary="Prometheus metrics of the gateway", response_class=PlainTextResponse)
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/predict", response_model=PredictOut, responses=ERROR_RESPONSES,
              summary="P(correct) for each candidate question of one learner")
    async def predict(body: PredictIn, deadline: Deadline = Depends(call_deadline)) -> PredictOut:
        query = PredictQuery(model=body.model, version=body.version, learners=[_learner(body, "", max_skills)])
        if body.explain is not None:              # the explain graph instead of the rank graph
            got = await explainer.explain(body.model, body.version, query.learners[0], body.explain.top_k, deadline)
            return PredictOut(probabilities=got.probabilities.tolist(), model=body.model, version=got.version,
                              history_used=got.history_used,
                              explanations=[_explanation(e) for e in got.explanations])
        learner = (result := await service.predict(query, deadline)).learners[0]
        return PredictOut(probabilities=learner.probabilities.tolist(), model=result.model,
                          version=learner.version, history_used=learner.history_used,
                          prediction_id=learner.prediction_id)

    @app.post("/v1/predict_batch", response_model=PredictBatchOut, responses=ERROR_RESPONSES,
              summary="P(correct) for the candidates of several learners")
    async def predict_batch(body: PredictBatchIn, deadline: Deadline = Depends(call_deadline)) -> PredictBatchOut:
        query = PredictQuery(model=body.model, version=body.version, batch=True,
                             learners=[_learner(l, f"learners[{i}].", max_skills) for i, l in enumerate(body.learners)])
        result = await service.predict(query, deadline)
        return PredictBatchOut(results=[LearnerOut(probabilities=r.probabilities.tolist(),
                                                   history_used=r.history_used, version=r.version,
                                                   prediction_id=r.prediction_id) for r in result.learners],
                               model=result.model, version=result.version)

    @app.post("/v1/recommend", response_model=RecommendOut, responses=ERROR_RESPONSES,
              summary="candidates ordered by |P(correct) - target_probability| (default 0.7), closest first")
    async def recommend(body: RecommendIn, deadline: Deadline = Depends(call_deadline)) -> RecommendOut:
        query = RecommendQuery(body.model, body.version, _learner(body, "", max_skills),
                               body.target_probability, body.top_k, body.exclude_seen,
                               body.explain.top_k if body.explain is not None else None)
        result = await recommender.recommend(query, deadline)
        explained = result.explanations or [None] * len(result.question_ids)
        return RecommendOut(recommendations=[RecommendationOut(question_id=q, probability=p,
                                                               explanation=_explanation(e) if e else None)
                                             for q, p, e in zip(result.question_ids, result.probabilities, explained)],
                            model=result.model, version=result.version, history_used=result.history_used,
                            excluded=result.excluded, prediction_id=result.prediction_id)

    @app.post("/v1/mastery", response_model=MasteryOut, responses=ERROR_RESPONSES,
              summary="P(correct) per skill for one learner (reads only, tracks nothing)")
    async def mastery(body: MasteryIn, deadline: Deadline = Depends(call_deadline)) -> MasteryOut:
        learner = _learner(body, "", max_skills, candidates=[])
        result = await masteries.mastery(MasteryQuery(body.model, body.version, learner,
                                                      np.array(body.skill_ids, dtype=np.int64)), deadline)
        return MasteryOut(skills=[SkillMasteryOut(skill_id=s, probability=p) for s, p in
                                  zip(result.skill_ids.tolist(), result.probabilities.tolist())],
                          model=result.model, version=result.version, history_used=result.history_used)

    @app.post("/v1/report_outcome", response_model=ReportOutcomeOut, responses=ERROR_RESPONSES,
              summary="record the answer to a question a stateless predict scored")
    async def report_outcome(body: ReportOutcomeIn, deadline: Deadline = Depends(call_deadline)) -> ReportOutcomeOut:
        if sessions is None:
            raise failed_precondition("this gateway does not track outcomes (it runs without a session store)")
        return ReportOutcomeOut(recorded=await sessions.report_outcome(
            body.prediction_id, body.question_id, body.correct, deadline))

    @app.get("/v1/rollout", summary="the rollout policy in force and the outcomes per version")
    async def rollout() -> dict[str, Any]:
        return {**endpoints.policy.status(), "quality": metrics.quality.summary()}

    @app.put("/v1/rollout/{model}", summary="set one model's rollout policy (written to the watched policy file)",
             responses=ERROR_RESPONSES)
    async def set_rollout(model: str, body: dict[str, Any]) -> dict[str, Any]:
        policy = await endpoints.policy.change(model, body)
        audit("rollout_change", model=model[:128], policy=policy)
        return {"model": model, "policy": policy}

    return app


def _learner(body: PredictIn | LearnerIn | RecommendIn | MasteryIn, prefix: str = "",
             max_skills: int = DEFAULT_MAX_SKILLS, candidates: list[CandidateIn] | None = None) -> LearnerQuery:
    """One learner's query; `history_columns` and skill sets as on gRPC (serving/core/calls.py);
    `candidates`: instead of the body's (Mastery has none)."""
    candidates = body.candidates if candidates is None else candidates
    if body.history_columns is not None:
        columns = body.history_columns
        hq, hs, hc, h_sets = column_arrays(columns.question_ids, columns.skill_ids, columns.correct,
                                           f"{prefix}history_columns", len(body.history), columns.skill_lengths,
                                           columns.skill_values, max_skills)
    else:
        hq = np.array([i.question_id for i in body.history], dtype=np.int64)
        hc = np.array([i.correct for i in body.history], dtype=np.int64)
        hs, h_sets = _skills(body.history, f"{prefix}history", max_skills)
    cs, c_sets = _skills(candidates, f"{prefix}candidates", max_skills)
    return LearnerQuery(hq, hs, hc, np.array([c.question_id for c in candidates], dtype=np.int64), cs,
                        body.learner_id, h_sets, c_sets)


def _explanation(e) -> ExplanationOut:
    return ExplanationOut(attended=[AttendedOut(**vars(a)) for a in e.attended], head_weights=e.head_weights)


def _skills(items: list[InteractionIn] | list[CandidateIn], field: str, max_skills: int):
    """`skill_id` / `skill_ids` of each item -> (rows [N, K], as_sets), serving/core/calls.py skill_sets."""
    return skill_sets(np.array([i.skill_id or 0 for i in items], dtype=np.int64),
                      np.array([i.skill_id is not None for i in items], dtype=bool),
                      [i.skill_ids for i in items] if any(i.skill_ids for i in items) else None, field, max_skills)


def _deadline(header: str | None, default_s: float) -> Deadline:
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


def _error(exc: ServingError, metrics) -> JSONResponse:
    """The HTTP mirror's one error site: counted once in routerkt_errors_total{code}, rendered with its
    status (serving/errors.py's HTTP_STATUS, or the error's HTTP refinement)."""
    metrics.errors.labels(code=exc.code_name).inc()
    headers = {"Retry-After": "1"} if exc.http_status in (429, 503) else None
    return JSONResponse(status_code=exc.http_status, content=exc.to_json(), headers=headers)


def _field_path(loc: tuple | list) -> str:
    """('body', 'history', 3, 'skill_id') -> 'history[3].skill_id'."""
    parts = [p for p in loc if p != "body"] if loc and loc[0] == "body" else list(loc)
    path = ""
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "body"
