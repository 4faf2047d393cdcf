"""The Python client's channel: gRPC retries on UNAVAILABLE for the idempotent calls, with backoff.

    from serving.client import connect
    with connect("127.0.0.1:50051") as channel:
        stub = pb_grpc.KnowledgeTracingServiceStub(channel)

Every RPC of routerkt.v1 is idempotent: Predict, PredictBatch and Recommend read only; Observe
stores an event id at most once; ForgetLearner deletes what is there. So each is retried, at most
RETRY_ATTEMPTS attempts in all, on UNAVAILABLE only (a restarting Triton or gateway, a store
failover), with exponential backoff from 50 ms to 1 s, always within the caller's deadline (gRPC
never retries past it). Other languages: use RETRY_SERVICE_CONFIG as the channel's service config.

Several gateways (sharing one session store, e.g. `--store redis://...`) are interchangeable:

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

import ipaddress
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


def connect(target: str) -> grpc.Channel:
    """An insecure channel to the gateway at `target` with the retry policy above."""
    return grpc.insecure_channel(target, options=channel_options())


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
