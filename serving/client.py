"""The Python client's channel: gRPC retries on UNAVAILABLE for the idempotent calls, with backoff.

    from serving.client import connect
    with connect("127.0.0.1:50051") as channel:
        stub = pb_grpc.KnowledgeTracingServiceStub(channel)

Every RPC of routerkt.v1 is idempotent: Predict, PredictBatch and Recommend read only; Observe
stores an event id at most once; ForgetLearner deletes what is there. So each is retried, at most
RETRY_ATTEMPTS attempts in all, on UNAVAILABLE only (a restarting Triton or gateway, a store
failover), with exponential backoff from 50 ms to 1 s, always within the caller's deadline (gRPC
never retries past it). Other languages: use RETRY_SERVICE_CONFIG as the channel's service config.

Several gateways (sharing one session store, e.g. `--store redis://...`) are interchangeable (LearnerRouter, at the
end, sends each learner to the one that holds its state):

    with connect_balanced(["127.0.0.1:50051", "127.0.0.1:50052"]) as channel:   # ipv4:A,B
        stub = pb_grpc.KnowledgeTracingServiceStub(channel)

balances the calls round-robin over the gateways that are connected and healthy (gRPC's
round_robin policy: one subchannel per address, each call on the next READY one; with client-side
health checking, a gateway whose grpc.health.v1 status "" is NOT_SERVING (no model answers, or it
is draining for shutdown) gets no new calls; an address that drops out is skipped and reconnected
in the background, every 2 s at most, so a restarted gateway gets calls again within about 2 s),
with the same retry policy: a call that fails with UNAVAILABLE because its gateway died is retried
on another one. Other languages: target `ipv4:A,B` (balanced_target), BALANCED_SERVICE_CONFIG as
the service config and the BALANCED_RECONNECT channel arguments; one DNS name that resolves to
every gateway (`dns:///gateways:50051`) works the same way.
"""
from __future__ import annotations

import bisect
import hashlib
import ipaddress
import itertools
import json
from collections.abc import Sequence

import grpc

SERVICE = "routerkt.v1.KnowledgeTracingService"
RETRY_ATTEMPTS = 4
RETRY_SERVICE_CONFIG = {
    "methodConfig": [{
        "name": [{"service": SERVICE}],
        "retryPolicy": {
            "maxAttempts": RETRY_ATTEMPTS,
            "initialBackoff": "0.05s",
            "maxBackoff": "1s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"],
        },
    }],
}
BALANCED_SERVICE_CONFIG = {**RETRY_SERVICE_CONFIG, "loadBalancingConfig": [{"round_robin": {}}],
                           "healthCheckConfig": {"serviceName": ""}}
BALANCED_RECONNECT = [("grpc.initial_reconnect_backoff_ms", 250), ("grpc.max_reconnect_backoff_ms", 2000)]


def channel_options(service_config: dict | None = None) -> list[tuple[str, object]]:
    config = RETRY_SERVICE_CONFIG if service_config is None else service_config
    return [("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(config)),
            ("grpc.enable_http_proxy", 0)]


MAX_TIMEOUT_S = 300.0       # a longer timeout is sent as this: grpcio itself fails a call at once whose
                            # deadline overflows (timeout=3e10 s), and the gateway caps at 300 s anyway


ROUTE_HEADER = "x-routerkt-route"     # what a hashing proxy in front of several gateways balances on


def route_key(learner_id: str) -> str:
    """The route header's value for a learner: the first 16 hex digits of SHA-256("routerkt-route:" + id). Stable in
    every client and language, so a proxy that hashes it (serving/deploy/k8s/haproxy.cfg) sends all of a learner's
    calls to one gateway; a digest, so the raw learner id never reaches the proxy's headers or logs."""
    return hashlib.sha256(f"routerkt-route:{learner_id}".encode()).hexdigest()[:16]


class _Access(grpc.UnaryUnaryClientInterceptor):
    """Adds the API key (authorization: Bearer) and, on a call naming one learner, its route header (route_key); caps
    the timeout at MAX_TIMEOUT_S."""

    def __init__(self, api_key: str | None) -> None:
        self.metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()

    def intercept_unary_unary(self, continuation, details, request):
        timeout = details.timeout if details.timeout is None or details.timeout <= MAX_TIMEOUT_S else MAX_TIMEOUT_S
        metadata = tuple(details.metadata or ()) + self.metadata
        learner_id = getattr(request, "learner_id", "")
        if learner_id and isinstance(learner_id, str):
            metadata += ((ROUTE_HEADER, route_key(learner_id)),)
        return continuation(_Details(details.method, timeout, metadata, details.credentials,
                                     details.wait_for_ready, details.compression), request)


class _Details(grpc.ClientCallDetails):
    def __init__(self, method, timeout, metadata, credentials, wait_for_ready, compression) -> None:
        self.method, self.timeout, self.metadata = method, timeout, metadata
        self.credentials, self.wait_for_ready, self.compression = credentials, wait_for_ready, compression


def connect(target: str, api_key: str | None = None, tls_ca: bytes | None = None,
            client_cert: tuple[bytes, bytes] | None = None) -> grpc.Channel:
    """A channel to the gateway at `target` with the retry policy above: TLS when `tls_ca` (PEM of
    the CA that signed the gateway's certificate) is given, with `client_cert` (key, certificate)
    for mTLS; `api_key` sent on every call; timeouts capped at MAX_TIMEOUT_S."""
    if tls_ca is None:
        channel = grpc.insecure_channel(target, options=channel_options())
    else:
        key, cert = client_cert or (None, None)
        credentials = grpc.ssl_channel_credentials(tls_ca, private_key=key, certificate_chain=cert)
        channel = grpc.secure_channel(target, credentials, options=channel_options())
    return grpc.intercept_channel(channel, _Access(api_key))


def balanced_target(addresses: Sequence[str] | str) -> str:
    """The gRPC target naming every gateway: "ipv4:A:P,B:P" for IPv4 literals, "ipv6:[A]:P,..."
    for IPv6 literals, "dns:///NAME:P" for ONE host name (every address it resolves to is used).
    `addresses`: HOST:PORT each, or one comma-separated string. ValueError for an empty list, a
    mix of kinds, or several host names (gRPC resolves one name per channel)."""
    if isinstance(addresses, str):
        addresses = addresses.split(",")
    items = [a.strip() for a in addresses if a.strip()]
    if not items:
        raise ValueError("no gateway address given")
    kinds = set()
    for item in items:
        host, sep, port = item.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"gateway address {item!r} is not HOST:PORT")
        try:
            kinds.add(f"ipv{ipaddress.ip_address(host.strip('[]')).version}")
        except ValueError:
            kinds.add("dns")
    if len(kinds) > 1:
        raise ValueError(f"gateway addresses mix {sorted(kinds)}; use one kind (IP literals or one DNS name)")
    kind = kinds.pop()
    if kind == "dns":
        if len(items) > 1:
            raise ValueError("several host names: give IP addresses, or one DNS name resolving to every gateway")
        return f"dns:///{items[0]}"
    return f"{kind}:" + ",".join(items)


def connect_balanced(addresses: Sequence[str] | str) -> grpc.Channel:
    """An insecure channel over several gateways (balanced_target): round-robin over the healthy
    ones, with the retry policy above (BALANCED_SERVICE_CONFIG, BALANCED_RECONNECT)."""
    return grpc.insecure_channel(balanced_target(addresses),
                                 options=channel_options(BALANCED_SERVICE_CONFIG) + BALANCED_RECONNECT)


RING_POINTS = 64            # points per gateway on the hash ring


class LearnerRouter:
    """Several gateways, each learner's calls sent to one of them by consistent hashing on its learner id, so that
    the gateway holding the learner's cached state answers it (a hit instead of a rebuild; docs/operations.md,
    "Several gateways"). Every gateway has RING_POINTS points on a ring of 64-bit hashes; a learner belongs to the
    first point at or after its id's hash. Adding or removing a gateway moves only the learners of its points.
    Answers never depend on the routing (the gateways share one store and check it before using a state).

        router = LearnerRouter(["127.0.0.1:50051", "127.0.0.1:50052"], api_key=KEY)
        response = router.call("Predict", pb.PredictRequest(learner_id="l-17", ...), timeout=5.0)

    `call` falls over to the next gateway on the ring when a call fails with UNAVAILABLE there (after the
    channel's own retries); a stateless call (no learner id) goes to the gateway of its first candidate's hash."""

    def __init__(self, addresses: Sequence[str] | str, api_key: str | None = None, tls_ca: bytes | None = None,
                 client_cert: tuple[bytes, bytes] | None = None) -> None:
        from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
        if isinstance(addresses, str):
            addresses = addresses.split(",")
        self.addresses = list(dict.fromkeys(a.strip() for a in addresses if a.strip()))
        if not self.addresses:
            raise ValueError("no gateway address given")
        self.channels = [connect(a, api_key, tls_ca, client_cert) for a in self.addresses]
        self.stubs = [pb_grpc.KnowledgeTracingServiceStub(c) for c in self.channels]
        points = sorted((_hash(f"{address}#{i}"), k) for k, address in enumerate(self.addresses)
                        for i in range(RING_POINTS))
        self._ring_hashes = [h for h, _ in points]
        self._ring_owners = [k for _, k in points]

    def owners(self, learner_id: str) -> list[int]:
        """The gateways (indices into `addresses`) in the order a learner's calls try them: its owner first."""
        start = bisect.bisect_left(self._ring_hashes, _hash(learner_id)) % len(self._ring_hashes)
        order: list[int] = []
        for k in itertools.chain(self._ring_owners[start:], self._ring_owners[:start]):
            if k not in order:
                order.append(k)
                if len(order) == len(self.addresses):
                    break
        return order

    def owner(self, learner_id: str) -> str:
        return self.addresses[self.owners(learner_id)[0]]

    def call(self, method: str, request, timeout: float | None = None, learner_id: str | None = None):
        """`method` (e.g. "Predict", "Observe") of the learner's gateway; the next one on UNAVAILABLE."""
        learner_id = learner_id if learner_id is not None else getattr(request, "learner_id", "")
        if not learner_id and getattr(request, "candidates", None):
            learner_id = f"question:{request.candidates[0].question_id}"
        error = None
        for k in self.owners(learner_id or ""):
            try:
                return getattr(self.stubs[k], method)(request, timeout=timeout)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                error = exc
        raise error  # type: ignore[misc]

    def close(self) -> None:
        for channel in self.channels:
            channel.close()

    def __enter__(self) -> LearnerRouter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
