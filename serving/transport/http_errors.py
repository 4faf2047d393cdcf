"""The HTTP mirror's errors: the one site that renders and counts them (`error_response`) and the
app's exception handlers, which turn every failure into it (serving/transport/http_api.py lists the
statuses). A ServingError raised anywhere (the deadline header, the service) becomes the JSON error
with its HTTP status; FastAPI's validation errors, unknown paths and methods answer in the same format."""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from serving import status_errors as errors
from serving.status_errors import ServingError, invalid_argument

log = logging.getLogger("routerkt.gateway.http")


def error_response(exc: ServingError, metrics) -> JSONResponse:
    """The HTTP mirror's one error site: counted once in routerkt_errors_total{code}, rendered with its
    status (serving/status_errors.py's HTTP_STATUS, or the error's HTTP refinement)."""
    metrics.errors.labels(code=exc.code_name).inc()
    headers = {"Retry-After": "1"} if exc.http_status in (429, 503) else None
    return JSONResponse(status_code=exc.http_status, content=exc.to_json(), headers=headers)


class ErrorHandlers:
    """The app's exception handlers, each answering through `error_response`."""

    def __init__(self, metrics) -> None:
        self.metrics = metrics

    def install(self, app: FastAPI) -> None:
        app.add_exception_handler(ServingError, self.serving_error)
        app.add_exception_handler(Exception, self.unexpected)
        app.add_exception_handler(RequestValidationError, self.bad_request)
        app.add_exception_handler(StarletteHTTPException, self.http_error)

    async def serving_error(self, request: Request, exc: ServingError) -> JSONResponse:
        return error_response(exc, self.metrics)

    async def unexpected(self, request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error while answering %s %s", request.method[:8], getattr(
            request.scope.get("route"), "path", "a request"))
        return error_response(errors.internal(), self.metrics)

    async def bad_request(self, request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": ("body",), "msg": "invalid request"}
        error = invalid_argument(field_path(first.get("loc", ())), str(first.get("msg", "invalid value")))
        return error_response(error, self.metrics)

    async def http_error(self, request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """Unknown paths (404) and methods (405) answer in the same error format as everything else."""
        error = (errors.no_such_path() if exc.status_code == 404 else errors.method_not_allowed(request.method)
                 if exc.status_code == 405 else invalid_argument("body", "invalid request"))
        response = error_response(error, self.metrics)
        response.headers.update(exc.headers or {})
        return response


def field_path(loc: tuple | list) -> str:
    """('body', 'history', 3, 'skill_id') -> 'history[3].skill_id'."""
    parts = [p for p in loc if p != "body"] if loc and loc[0] == "body" else list(loc)
    path = ""
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "body"
