"""The HTTP mirror's middleware, outermost first: RequestCounter (routerkt_http_requests_total by route
and status), AuthGate (API key and scope before any of the body is read) and BodyGuard (the body's
size and arrival time). serving/transport/http_api.py stacks them."""
from __future__ import annotations

import asyncio
import logging
import time

from fastapi import Request
from fastapi.responses import Response
from starlette.routing import Match

from serving import status_errors as errors
from serving.status_errors import ServingError
from serving.security.failures import peer_address
from serving.security.scopes import http_scope
from serving.transport.http_errors import error_response

log = logging.getLogger("routerkt.gateway.http")
DISCONNECT_LOG_EVERY_S = 10.0     # a client hanging up before its answer: counted, logged this rarely


class RequestCounter:
    """The dispatch of a BaseHTTPMiddleware: counts every answered request by its route's path ("other"
    for none) and status; a client that hung up before its answer counts as 499 (logged at most every
    DISCONNECT_LOG_EVERY_S)."""

    def __init__(self, metrics) -> None:
        self.metrics = metrics
        self.last_disconnect_log = -DISCONNECT_LOG_EVERY_S

    async def __call__(self, request: Request, call_next) -> Response:
        try:
            response = await call_next(request)
        except RuntimeError as exc:               # "No response returned.": the client hung up first
            if str(exc) != "No response returned.":     # (BodyGuard answers nothing to a client gone)
                raise
            response = Response(status_code=499)
            if time.monotonic() - self.last_disconnect_log >= DISCONNECT_LOG_EVERY_S:
                self.last_disconnect_log = time.monotonic()
                log.info("HTTP clients hung up before their answer (counted as status 499; logged at most "
                         "every %.0fs)", DISCONNECT_LOG_EVERY_S)
        route = request.scope.get("route")
        handler = getattr(route, "path", "other")
        self.metrics.http_requests.labels(handler=handler, status=str(response.status_code)).inc()
        return response


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
        response = error_response(error, self.metrics)
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
            response = error_response(exc, self.metrics)
            if method not in ("GET", "HEAD"):            # its body stays unread: no reuse of the connection
                response.headers["Connection"] = "close"
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
