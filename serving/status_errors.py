"""The gateway's client-facing errors: one exception type carrying a canonical gRPC code, a message
that is safe to show (no paths, no tracebacks, no Triton error text) and, for INVALID_ARGUMENT, the
offending field (`history[3].skill_id`, `learners[1].candidates`).

Both transports render it: gRPC as the status code + message (the field also travels in the
trailing metadata key `routerkt-field`), HTTP as a status from `HTTP_STATUS` and a JSON body
{"error": {"code", "message", "field"}}.
"""
from __future__ import annotations

import grpc

FIELD_METADATA_KEY = "routerkt-field"

HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNIMPLEMENTED: 501,
}


class ServingError(Exception):
    """A request failed with `code`; str(error) is the client-safe message."""

    def __init__(self, code: grpc.StatusCode, message: str, field: str | None = None,
                 http_status: int | None = None) -> None:
        self.code = code
        self.message = f"{field}: {message}" if field else message
        self.field = field
        self._http_status = http_status          # an HTTP-only refinement of HTTP_STATUS (below)
        super().__init__(self.message)

    @property
    def code_name(self) -> str:
        return self.code.name

    @property
    def http_status(self) -> int:
        return self._http_status or HTTP_STATUS.get(self.code, 500)

    def to_json(self) -> dict[str, object]:
        return {"error": {"code": self.code.name, "message": self.message, "field": self.field}}


SHOWN_NAME_CHARS = 64       # a client-supplied name is echoed at most this long in a message


def shown(name: str) -> str:
    """A client-supplied name as it may appear in an error message: quoted, at most SHOWN_NAME_CHARS."""
    text = repr(name)
    return text if len(text) <= SHOWN_NAME_CHARS else text[:SHOWN_NAME_CHARS - 4] + "...'"


def invalid_argument(field: str, message: str) -> ServingError:
    return ServingError(grpc.StatusCode.INVALID_ARGUMENT, message, field)


def not_found(message: str, field: str | None = None) -> ServingError:
    return ServingError(grpc.StatusCode.NOT_FOUND, message, field)


def failed_precondition(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.FAILED_PRECONDITION, message)


def unavailable(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.UNAVAILABLE, message)


def resource_exhausted(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.RESOURCE_EXHAUSTED, message)


def deadline_exceeded(message: str = "deadline exceeded") -> ServingError:
    return ServingError(grpc.StatusCode.DEADLINE_EXCEEDED, message)


def internal() -> ServingError:
    """A bug or an unexpected failure: the details are in the server log only."""
    return ServingError(grpc.StatusCode.INTERNAL, "internal error (details are in the gateway log)")


# -- HTTP-only refinements: the same gRPC code, a more precise HTTP status --------------------------
def body_timeout(seconds: float) -> ServingError:
    """The HTTP body did not arrive in time: DEADLINE_EXCEEDED, HTTP 408 (the client's fault, not 504)."""
    return ServingError(grpc.StatusCode.DEADLINE_EXCEEDED, f"the body did not arrive within {seconds:g} s", "body",
                        http_status=408)


def body_too_large(limit: int) -> ServingError:
    """The HTTP body is over the size limit: RESOURCE_EXHAUSTED, HTTP 413 (not 429: retrying will not help)."""
    return ServingError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"over {limit} bytes", "body", http_status=413)


def no_such_path() -> ServingError:
    return ServingError(grpc.StatusCode.NOT_FOUND, "no such path")


def method_not_allowed(method: str) -> ServingError:
    """An HTTP method a route does not take: UNIMPLEMENTED, HTTP 405."""
    return ServingError(grpc.StatusCode.UNIMPLEMENTED, f"method {method[:16]} is not allowed here", http_status=405)

