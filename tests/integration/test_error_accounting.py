"""routerkt_errors_total counts every failed call exactly once, where its transport answers it: gRPC and
HTTP alike, for the pipeline's refusals, the session calls, the auth refusals and the HTTP body guard,
each with its code from serving/status_errors.py's table (HTTP statuses refined there: 408, 413, 405)."""
from __future__ import annotations

import re

import grpc
import httpx
import pytest

from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from tests.helpers import grpc_status as code
from tests.integration.test_security_failures import BODY, REQUEST, start

pytestmark = pytest.mark.integration


def errors(http: httpx.Client) -> dict[str, float]:
    return {c: float(v) for c, v in re.findall(r'^routerkt_errors_total\{code="(\w+)"\} (\S+)$',
                                               http.get("/metrics").text, re.M)}


def test_every_failed_call_is_counted_once_on_both_transports(handmade_repository, tmp_path) -> None:
    gw, tokens = start(handmade_repository, tmp_path, auth_failure_burst=0, max_message_bytes=4096)
    key = {scope: (("authorization", f"Bearer {token}"),) for scope, token in tokens.items()}
    try:
        with grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}") as channel, \
                httpx.Client(base_url=f"http://127.0.0.1:{gw.http_port}", timeout=10, trust_env=False,
                             headers={"Authorization": f"Bearer {tokens['predict']}"}) as http:
            stub = pb_grpc.KnowledgeTracingServiceStub(channel)
            before = errors(http)
            cases = [
                (lambda: stub.Predict(REQUEST, timeout=5), "UNAUTHENTICATED"),                  # no key
                (lambda: stub.Predict(pb.PredictRequest(model="nope", candidates=[pb.Candidate(question_id=1)]),
                                      timeout=5, metadata=key["predict"]), "NOT_FOUND"),
                (lambda: stub.Observe(pb.ObserveRequest(learner_id="", events=[]), timeout=5, metadata=key["observe"]),
                 "INVALID_ARGUMENT"),                                                             # a session call
                (lambda: stub.ForgetLearner(pb.ForgetLearnerRequest(learner_id=""), timeout=5, metadata=key["admin"]),
                 "INVALID_ARGUMENT"),
            ]
            for call, name in cases:
                assert code(call).name == name
            routes = [(http.post("/v1/predict", json={**BODY, "model": "nope"}), 404, "NOT_FOUND"),
                      (http.post("/v1/predict", json={**BODY, "candidates": "x"}), 400, "INVALID_ARGUMENT"),
                      (http.post("/v1/predict", content=b"{" * 20_000, headers={"Content-Type": "application/json"}),
                       413, "RESOURCE_EXHAUSTED"),
                      (http.post("/v1/predict", json=BODY, headers={"Authorization": "Bearer nope.x"}), 401,
                       "UNAUTHENTICATED"),
                      (http.delete("/v1/predict"), 405, "UNIMPLEMENTED"),
                      (http.get("/v1/nothing-here"), 404, "NOT_FOUND")]
            for response, status, name in routes:
                assert (response.status_code, response.json()["error"]["code"]) == (status, name), response.text
            after = errors(http)
    finally:
        gw.stop(grace=0.5)
    grown = {c: after.get(c, 0) - before.get(c, 0) for c in set(after) | set(before)}
    assert {c: n for c, n in grown.items() if n} == {"UNAUTHENTICATED": 2, "NOT_FOUND": 3, "INVALID_ARGUMENT": 3,
                                                     "RESOURCE_EXHAUSTED": 1, "UNIMPLEMENTED": 1}
