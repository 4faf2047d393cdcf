"""Failed authentication and denied scopes: counted, logged at a bounded rate, and limited.

Every failure is counted in routerkt_auth_failures_total{transport, reason} (reason: missing,
malformed, invalid, denied, limited; never anything of the key) and logged on "routerkt.security"
with the peer's address, the key id when it names a key of the file ("unknown" otherwise) and the
method or route; at most one line per transport and reason per LOG_EVERY_S, the next line saying how
many were left out. The peer is the connection's own address (HTTP: a forwarded one only from
settings.trusted_proxies); peer, key id and target are escaped (`printable`: anything but printable
ASCII as a backslash escape, bounded), so no caller-chosen byte can forge or break a log line.

The limit: a token bucket of `burst` failed attempts per peer address and per key id, refilled at
`per_s` a second. A failure finding its peer's or its key id's bucket empty is answered
RESOURCE_EXHAUSTED (HTTP 429, Retry-After) instead of UNAUTHENTICATED / PERMISSION_DENIED. Only
failures take from the buckets and a call whose key grants its scope never looks at them, so an
authorised caller is never slowed, even behind an address shared with a failing one. Buckets
back to full are forgotten (at most MAX_TRACKED are held).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import grpc

from serving.status_errors import ServingError

log = logging.getLogger("routerkt.security")

LOG_EVERY_S = 1.0
MAX_TRACKED = 10_000
REASONS = ("missing", "malformed", "invalid", "denied", "limited")
UNKNOWN = "unknown"


class TokenBuckets:
    """Budgets per name: `burst` tokens at most, `per_s` added a second; a bucket is made full."""

    def __init__(self, burst: int, per_s: float, clock: Callable[[], float] = time.monotonic,
                 max_tracked: int = MAX_TRACKED) -> None:
        self.burst, self.per_s, self.clock, self.max_tracked = burst, per_s, clock, max_tracked
        self._buckets: dict[str, tuple[float, float]] = {}      # name -> (tokens, when)

    def take(self, name: str) -> bool:
        """Take one token of `name`'s bucket; False when it is empty."""
        now = self.clock()
        tokens, when = self._buckets.get(name, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - when) * self.per_s)
        if tokens < 1.0:
            self._buckets[name] = (tokens, now)
            return False
        self._buckets[name] = (tokens - 1.0, now)
        if len(self._buckets) > self.max_tracked:
            self._forget_full(now)
        return True

    def _forget_full(self, now: float) -> None:
        """Drop the buckets that are full again (as if never seen); else the oldest half."""
        full = [name for name, (tokens, when) in self._buckets.items()
                if tokens + (now - when) * self.per_s >= self.burst]
        for name in full:
            del self._buckets[name]
        if len(self._buckets) > self.max_tracked:
            for name in list(self._buckets)[:len(self._buckets) // 2]:
                del self._buckets[name]

    def __len__(self) -> int:
        return len(self._buckets)


def printable(text: str, limit: int) -> str:
    """`text` fit for a log line: printable ASCII as it is (a backslash doubled), anything else as its
    escape (\\n, \\x85, \\u2028, ...), cut to `limit` characters."""
    escaped = text.encode("unicode_escape").decode("ascii")
    return escaped if len(escaped) <= limit else escaped[:limit] + "..."


@dataclass(frozen=True)
class Failure:
    """One failed call: how it failed, where it came from, which key it named and what it called
    (peer, key id and target escaped by `printable` as the failure is made)."""

    transport: str          # "grpc" | "http"
    reason: str             # missing | malformed | invalid | denied
    peer: str               # the client's address, without its port
    key_id: str             # a key id of the file, or UNKNOWN / "-"
    target: str             # the gRPC method or "METHOD /route"

    def __post_init__(self) -> None:
        for name, limit in (("peer", 64), ("key_id", 64), ("target", 160)):
            object.__setattr__(self, name, printable(str(getattr(self, name)), limit))


def peer_address(peer: str | None) -> str:
    """The address part of a peer: grpc's "ipv4:10.0.0.7:5123" / "ipv6:[::1]:5123", or a host as
    HTTP gives it; "-" when unknown."""
    if not peer:
        return "-"
    kind, sep, rest = peer.partition(":")
    if sep and kind in ("ipv4", "ipv6"):
        host = rest.rsplit(":", 1)[0]
        return host.strip("[]")[:64]
    if sep and kind == "unix":
        return "unix"
    return peer[:64]


class AuthFailures:
    """Counts, logs and limits failed calls (see the module docstring)."""

    def __init__(self, counter=None, burst: int = 20, per_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.counter = counter                      # Metrics.auth_failures (labels transport, reason)
        self.limited = burst > 0
        self.peers = TokenBuckets(burst, per_s, clock)
        self.key_ids = TokenBuckets(burst, per_s, clock)
        self.clock = clock
        self._last_log: dict[tuple[str, str], float] = {}
        self._left_out: dict[tuple[str, str], int] = {}

    def refuse(self, failure: Failure, error: ServingError) -> ServingError:
        """Record `failure`; the error to answer: `error`, or RESOURCE_EXHAUSTED when over the limit."""
        over = self.limited and not (self.peers.take(failure.peer) and
                                     (failure.key_id in (UNKNOWN, "-") or self.key_ids.take(failure.key_id)))
        reason = "limited" if over else failure.reason
        if self.counter is not None:
            self.counter.labels(transport=failure.transport, reason=reason).inc()
        self._log(failure, reason)
        if over:
            return ServingError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                "too many failed authentication attempts from this client or for this key; retry later")
        return error

    def _log(self, failure: Failure, reason: str) -> None:
        slot = (failure.transport, reason)
        now = self.clock()
        if now - self._last_log.get(slot, -LOG_EVERY_S) < LOG_EVERY_S:
            self._left_out[slot] = self._left_out.get(slot, 0) + 1
            return
        self._last_log[slot] = now
        left_out = self._left_out.pop(slot, 0)
        what = {"missing": "no API key", "malformed": "a malformed authorization header",
                "invalid": "an invalid API key", "denied": "a key lacking the scope",
                "limited": "a failure over the limit (answered RESOURCE_EXHAUSTED)"}[reason]
        log.warning("authentication failure (%s): %s from %s, key id %s, calling %s%s", failure.transport, what,
                    failure.peer, failure.key_id, failure.target,
                    f"; {left_out} more like it since the last line (routerkt_auth_failures_total)" if left_out else "")
