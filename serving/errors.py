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
}


class ServingError(Exception):
    """A request failed with `code`; str(error) is the client-safe message."""

    def __init__(self, code: grpc.StatusCode, message: str, field: str | None = None) -> None:
        self.code = code
        self.message = f"{field}: {message}" if field else message
        self.field = field
        super().__init__(self.message)

    @property
    def code_name(self) -> str:
        return self.code.name

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)

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
