"""The Python client's channel: gRPC retries on UNAVAILABLE for the idempotent calls, with backoff.

    from serving.client import connect
    with connect("127.0.0.1:50051") as channel:
        stub = pb_grpc.KnowledgeTracingServiceStub(channel)

Every RPC of routerkt.v1 is idempotent: Predict, PredictBatch and Recommend read only; Observe
stores an event id at most once; ForgetLearner deletes what is there. So each is retried, at most
RETRY_ATTEMPTS attempts in all, on UNAVAILABLE only (a restarting Triton or gateway, a store
failover), with exponential backoff from 50 ms to 1 s, always within the caller's deadline (gRPC
never retries past it). Other languages: use RETRY_SERVICE_CONFIG as the channel's service config.
"""
from __future__ import annotations

import json

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


def channel_options() -> list[tuple[str, object]]:
    return [("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(RETRY_SERVICE_CONFIG)),
            ("grpc.enable_http_proxy", 0)]


def connect(target: str) -> grpc.Channel:
    """An insecure channel to the gateway at `target` with the retry policy above."""
    return grpc.insecure_channel(target, options=channel_options())
