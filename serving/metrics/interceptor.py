"""The grpc.aio server interceptor that fills the grpc_server_* family (serving/metrics/__init__.py
declares it): one started, one handled (with its final code) and one latency per unary RPC."""
from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, Protocol

import grpc
from prometheus_client import Counter, Histogram


class GrpcCallMetrics(Protocol):
    """The metrics the interceptor fills (Metrics has them)."""

    grpc_started: Counter
    grpc_handled: Counter
    grpc_handling_seconds: Histogram


def split_method(full_method: str) -> tuple[str, str]:
    """'/routerkt.v1.KnowledgeTracingService/Predict' -> ('routerkt.v1.KnowledgeTracingService', 'Predict')."""
    service, _, method = full_method.lstrip("/").rpartition("/")
    return service or "unknown", method or "unknown"


class MetricsInterceptor(grpc.aio.ServerInterceptor):
    """Counts every unary RPC (ours, health Check) with its final status code, including the
    INVALID_ARGUMENT / NOT_FOUND / ... aborts of the servicer. Streaming RPCs (health Watch,
    reflection) pass through uncounted. Messages rejected by gRPC itself before any handler runs
    (over max_receive_message_length) never reach an interceptor and are not counted here.
    Per call it costs a dict lookup and three metric updates: the wrapped handler and the labelled
    children are made once per method (and per final code)."""

    def __init__(self, metrics: GrpcCallMetrics) -> None:
        self.metrics = metrics
        self._wrapped: dict[str, tuple[Any, Any]] = {}      # method -> (its handler, the handler wrapped)

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]],
                                handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = handler_call_details.method
        known = self._wrapped.get(method)
        if known is None or known[0] is not handler:     # a new handler object: wrapped anew (one entry a method)
            known = self._wrapped[method] = (handler, self._wrap(handler, method))
        return known[1]

    def _wrap(self, handler: Any, full_method: str) -> Any:
        service, method = split_method(full_method)
        labels = {"grpc_service": service, "grpc_method": method, "grpc_type": "unary"}
        inner = handler.unary_unary
        started_total = self.metrics.grpc_started.labels(**labels)
        seconds = self.metrics.grpc_handling_seconds.labels(**labels)
        handled_family = self.metrics.grpc_handled
        handled: dict[Any, Any] = {}

        def count(code: Any) -> None:
            child = handled.get(code)
            if child is None:
                child = handled[code] = handled_family.labels(**labels, grpc_code=_code_name(code))
            child.inc()

        async def observed(request: Any, context: grpc.aio.ServicerContext) -> Any:
            started_total.inc()
            started = time.perf_counter()
            code = grpc.StatusCode.UNKNOWN
            try:
                response = await inner(request, context)
                code = context.code() or grpc.StatusCode.OK
                return response
            except asyncio.CancelledError:
                remaining = context.time_remaining()
                code = (grpc.StatusCode.DEADLINE_EXCEEDED if remaining is not None and remaining <= 0
                        else grpc.StatusCode.CANCELLED)
                raise
            except BaseException:
                code = context.code() or grpc.StatusCode.UNKNOWN     # abort() sets the code first
                raise
            finally:
                count(code)
                seconds.observe(time.perf_counter() - started)

        return grpc.unary_unary_rpc_method_handler(
            observed, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)


def _code_name(code: Any) -> str:
    if isinstance(code, grpc.StatusCode):
        return code.name
    if isinstance(code, int):                        # some paths report the integer value
        for member in grpc.StatusCode:
            if member.value[0] == code:
                return member.name
    return "UNKNOWN"
