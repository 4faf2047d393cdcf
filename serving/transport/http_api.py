"""The gateway's HTTP app (FastAPI, served by uvicorn on the gRPC server's event loop): create_app
assembles the routes (http_routes.py), the middleware (http_middleware.py) and the error handlers
(http_errors.py) over a gateway's endpoints. The routes:

- GET  /metrics            Prometheus text format (this gateway's registry only; Triton's metrics
                            stay on Triton's own port)
- GET  /livez              200 while the process runs
- GET  /readyz             200 only when Triton and at least one model are ready (503 otherwise,
                            and from the start of shutdown on)
- POST /v1/predict         JSON mirror of Predict
- POST /v1/predict_batch   JSON mirror of PredictBatch
- POST /v1/recommend       JSON mirror of Recommend
- POST /v1/mastery         JSON mirror of Mastery
- POST /v1/report_outcome  JSON mirror of ReportOutcome
- GET  /v1/rollout         the rollout policy in force, a refused file's error, outcome counts
- PUT  /v1/rollout/{model} set one model's rollout (the policy file's JSON for it; admin, audited)
- GET  /openapi.json, /docs

The JSON calls run the same PredictionService as gRPC (same validation, limits, in-flight slots):
the routes (http_routes.py) only turn JSON bodies into PredictQuery (serving/core/calls.py) and results back.
Errors are {"error": {"code": <gRPC code name>, "message", "field"}} with HTTP 400 (INVALID_ARGUMENT,
also for malformed JSON / wrong types), 401 (no valid API key; checked before the body is read, so
a malformed body without a key is 401), 403 (the key lacks the route's scope:
serving/security/scopes.py), 404 (NOT_FOUND), 413 (body over the size limit), 429
(RESOURCE_EXHAUSTED; also failed keys over the limit of serving/security/failures.py), 503
(UNAVAILABLE), 504 (DEADLINE_EXCEEDED), 500 (INTERNAL): serving/status_errors.py's table, with its HTTP
refinements (408, 413, 405). Every error is counted once, where it is rendered (http_errors.py,
`error_response`). The deadline is settings.default_deadline_s unless the `X-Request-Timeout` header
gives one in seconds (capped at http_routes.MAX_REQUEST_TIMEOUT_S, 60). Input is strict: JSON
integers only (no bool, string or float for an id or `correct`), text without lone surrogates, a
body of at most 4x max_message_bytes also when chunked (413), arriving within
settings.http_body_timeout_s (408).
"""
from __future__ import annotations

from fastapi import FastAPI
from starlette.middleware.base import BaseHTTPMiddleware

from serving.transport.endpoints import Endpoints
from serving.transport.http_errors import ErrorHandlers
from serving.transport.http_middleware import AuthGate, BodyGuard, RequestCounter
from serving.transport.http_routes import RouteContext, call_routes, health_routes, rollout_routes

JSON_SIZE_FACTOR = 4          # a JSON body may be this many times settings.max_message_bytes


def create_app(endpoints: Endpoints) -> FastAPI:
    """The FastAPI app over a gateway's endpoints. One error mapping for every route: a ServingError
    raised anywhere (the deadline header, the service) becomes the JSON error with its HTTP status."""
    context = RouteContext(endpoints)
    settings, metrics = context.settings, context.metrics
    app = FastAPI(title="RouterKT gateway", version="1",
                  description="JSON mirror of routerkt.v1.KnowledgeTracingService, plus health and metrics.")
    app.state.route_context = context
    # Middleware added later runs outside: RequestCounter, then AuthGate, then BodyGuard, then the routes.
    app.add_middleware(BodyGuard, max_bytes=settings.max_message_bytes * JSON_SIZE_FACTOR,
                       read_timeout_s=settings.http_body_timeout_s, metrics=metrics)
    app.add_middleware(AuthGate, guard=endpoints.guard, router=app.router, metrics=metrics)
    app.add_middleware(BaseHTTPMiddleware, dispatch=RequestCounter(metrics))
    ErrorHandlers(metrics).install(app)
    for routes in (health_routes, call_routes, rollout_routes):
        routes.add_to(app)
    return app
