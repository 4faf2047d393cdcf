"""The check every call passes: the caller's API key and the scope its method needs (scopes.py).

Without a keys file (`--api-keys`) every call passes (the loopback development default). With one,
a call without a valid key is UNAUTHENTICATED (HTTP 401) and a valid key lacking the scope is
PERMISSION_DENIED (403); the messages never say whether a key id exists. The caller's key id is
kept in a context variable for the audit log (audit.py) for the rest of the call.
"""
from __future__ import annotations

from contextvars import ContextVar

import grpc

from serving.errors import ServingError
from serving.security.api_keys import KeyFile
from serving.security.scopes import PUBLIC

CALLER: ContextVar[str] = ContextVar("routerkt_caller", default="-")   # key id, "-" without keys
BEARER = "bearer "
MAX_TOKEN_CHARS = 256


def unauthenticated() -> ServingError:
    return ServingError(grpc.StatusCode.UNAUTHENTICATED,
                        "a valid API key is required (header authorization: Bearer <key>)")


def permission_denied(scope: str) -> ServingError:
    return ServingError(grpc.StatusCode.PERMISSION_DENIED, f"this API key lacks the scope {scope!r}")


class Guard:
    """API keys and scopes; `keys` None: everything is allowed."""

    def __init__(self, keys: KeyFile | None = None) -> None:
        self.keys = keys

    @property
    def enabled(self) -> bool:
        return self.keys is not None

    def check(self, scope: str, authorization: str | None) -> None:
        """Raise ServingError unless `authorization` ("Bearer <key>") grants `scope`."""
        if self.keys is None or scope == PUBLIC:
            return
        if not authorization or len(authorization) > MAX_TOKEN_CHARS or \
                not authorization[:len(BEARER)].lower() == BEARER:
            raise unauthenticated()
        key = self.keys.lookup(authorization[len(BEARER):].strip())
        if key is None:
            raise unauthenticated()
        CALLER.set(key.key_id)
        if scope not in key.scopes:
            raise permission_denied(scope)

    def check_grpc(self, scope: str, metadata) -> None:
        """`check` with the call's invocation metadata ((key, value) pairs)."""
        if self.keys is None:
            return
        self.check(scope, next((value for key, value in metadata or () if key == "authorization"), None))
