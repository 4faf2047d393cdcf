"""The check every call passes: the caller's API key and the scope its method needs (scopes.py).

Without a keys file (`--api-keys`) every call passes (the loopback development default). With one,
a call without a valid key is UNAUTHENTICATED (HTTP 401) and a valid key lacking the scope is
PERMISSION_DENIED (403); the messages never say whether a key id exists. The caller's key id is
kept in a context variable for the audit log (audit.py) for the rest of the call. Every failure is
counted, logged at a bounded rate and limited per peer and key id (failures.py); a call whose key
grants its scope returns before any of that.
"""
from __future__ import annotations

from contextvars import ContextVar
from typing import Callable

import grpc

from serving.status_errors import ServingError
from serving.security.api_keys import KeyFile
from serving.security.failures import UNKNOWN, AuthFailures, Failure, peer_address
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
    """API keys and scopes; `keys` None: everything is allowed. `failures`: what records and limits
    the failed calls (a default one, without a metric, when None)."""

    def __init__(self, keys: KeyFile | None = None, failures: AuthFailures | None = None) -> None:
        self.keys = keys
        self.failures = failures or AuthFailures()

    @property
    def enabled(self) -> bool:
        return self.keys is not None

    def check(self, scope: str, authorization: str | None, peer: Callable[[], str] = lambda: "-",
              transport: str = "grpc", target: str = "-") -> None:
        """Raise ServingError unless `authorization` ("Bearer <key>") grants `scope`; `peer` (called
        on a failure only: the client's address), `transport` and `target` (method or route)
        describe a failure."""
        if self.keys is None or scope == PUBLIC:
            return
        if not authorization or len(authorization) > MAX_TOKEN_CHARS or \
                not authorization[:len(BEARER)].lower() == BEARER:
            reason = "missing" if not authorization else "malformed"
            raise self.failures.refuse(Failure(transport, reason, peer(), "-", target), unauthenticated())
        token = authorization[len(BEARER):].strip()
        key = self.keys.lookup(token)
        if key is None:
            named = token.partition(".")[0]
            key_id = named if self.keys.known(named) else UNKNOWN
            raise self.failures.refuse(Failure(transport, "invalid", peer(), key_id, target), unauthenticated())
        CALLER.set(key.key_id)
        if scope not in key.scopes:
            raise self.failures.refuse(Failure(transport, "denied", peer(), key.key_id, target),
                                       permission_denied(scope))

    def check_grpc(self, scope: str, context, method: str = "-") -> None:
        """`check` with a gRPC call's context (its invocation metadata and peer)."""
        if self.keys is None:
            return
        metadata = context.invocation_metadata()
        self.check(scope, next((value for key, value in metadata or () if key == "authorization"), None),
                   lambda: peer_address(context.peer()), "grpc", method)
