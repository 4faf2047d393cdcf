"""The grpc_server_* family (serving/metrics/__init__.py declares it), counted by the method handlers
themselves: one started, one handled (with its final code) and one latency per unary RPC. `CountingRegistry`
stands in for the grpc.aio server when a service registers (our add_to_server, the generated
add_HealthServicer_to_server) and wraps each unary handler once, at registration. No server interceptor: with
one, grpc.aio awaits the interceptor chain on every call, and the gateway spent 7% more CPU per cached Predict
(docs/benchmarks.md, "The metrics without an interceptor")."""
from __future__ import annotations

import asyncio
import functools
import time
from typing import Any, Protocol, Sequence

import grpc
from prometheus_client import Counter, Histogram


class GrpcCallMetrics(Protocol):
    """The metrics the counted handlers fill (Metrics has them)."""

    grpc_started: Counter
    grpc_handled: Counter
    grpc_handling_seconds: Histogram


def split_method(full_method: str) -> tuple[str, str]:
    """'/routerkt.v1.KnowledgeTracingService/Predict' -> ('routerkt.v1.KnowledgeTracingService', 'Predict')."""
    service, _, method = full_method.lstrip("/").rpartition("/")
    return service or "unknown", method or "unknown"


class CountingRegistry:
    """Registers a service's handlers on `server` with every unary-unary one counted (`counted`); streaming
    ones (health Watch) pass through uncounted. Messages rejected by gRPC itself before any handler runs (over
    max_receive_message_length) are not counted here."""

    def __init__(self, server: Any, metrics: GrpcCallMetrics) -> None:
        self.server = server
        self.metrics = metrics

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self.server.add_generic_rpc_handlers(tuple(_CountedGeneric(h, self.metrics) for h in handlers))

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.server.add_registered_method_handlers(
            service, {method: counted(handler, f"/{service}/{method}", self.metrics)
                      for method, handler in handlers.items()})


class _CountedGeneric(grpc.GenericRpcHandler):
    """A generic handler whose unary handlers are counted (each wrapped once, on its first call)."""

    def __init__(self, inner: grpc.GenericRpcHandler, metrics: GrpcCallMetrics) -> None:
        self.inner = inner
        self.metrics = metrics
        self._wrapped: dict[str, tuple[Any, Any]] = {}      # method -> (its handler, the handler counted)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = self.inner.service(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        known = self._wrapped.get(method)
        if known is None or known[0] is not handler:
            known = self._wrapped[method] = (handler, counted(handler, method, self.metrics))
        return known[1]


def counted(handler: Any, full_method: str, metrics: GrpcCallMetrics) -> Any:
    """`handler` with its calls counted in the grpc_server_* family, if it is unary-unary (else `handler`):
    the wrapper and the labelled children are made here, so a call costs three metric updates. The final
    code includes the INVALID_ARGUMENT / NOT_FOUND / ... aborts of the servicer."""
    if handler.unary_unary is None:
        return handler
    service, method = split_method(full_method)
    labels = {"grpc_service": service, "grpc_method": method, "grpc_type": "unary"}
    inner = handler.unary_unary
    started_total = metrics.grpc_started.labels(**labels)
    seconds = metrics.grpc_handling_seconds.labels(**labels)
    handled = functools.lru_cache(maxsize=None)(
        lambda code: metrics.grpc_handled.labels(**labels, grpc_code=_code_name(code)))  # a child per final code

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
            handled(code).inc()
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
