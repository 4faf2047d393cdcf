"""Two transport defects, fixed: a gRPC call with a very long deadline is answered (capped at
settings.max_deadline_s, never taken as expired), and an HTTP client hanging up before its answer
is counted (status 499) and logged in at most one line, without a traceback."""
from __future__ import annotations

import logging
import socket
import time

import grpc
import httpx
import pytest

from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.client import connect
from serving.server import ThreadedGateway
from serving.settings import Settings
from tests.helpers import wait_for
from tests.integration.security_helpers import FakeBackend

pytestmark = pytest.mark.integration

REQUEST = pb.PredictRequest(model="kt", history=[pb.Interaction(question_id=100, skill_id=7, correct=1)],
                            candidates=[pb.Candidate(question_id=101)])


@pytest.fixture(scope="module")
def gateway(handmade_repository):
    backend = FakeBackend()
    settings = Settings(repository=handmade_repository, grpc_port=0, http_port=0, grace_period_s=0.5)
    gw = ThreadedGateway(settings, backend=backend).start()
    try:
        yield gw, backend
    finally:
        gw.stop(0.5)


@pytest.mark.parametrize("timeout", [3e10, 1e12, 3e9, 1e8])
def test_a_very_long_deadline_is_capped_not_expired(gateway, timeout: float) -> None:
    gw, backend = gateway
    with connect(f"127.0.0.1:{gw.grpc_port}") as channel:               # the shipped client
        assert pb_grpc.KnowledgeTracingServiceStub(channel).Predict(REQUEST, timeout=timeout).model == "kt"
    if timeout < 1e10:                                                  # what grpcio itself can send
        with grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}") as channel:
            assert pb_grpc.KnowledgeTracingServiceStub(channel).Predict(REQUEST, timeout=timeout).model == "kt"
    assert 0 < backend.timeouts[-1] <= gw.server.settings.max_deadline_s


def test_an_http_client_hanging_up_is_counted_without_a_traceback(gateway, caplog) -> None:
    gw, _ = gateway
    caplog.set_level(logging.INFO)
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", gw.http_port)) as sock:
            sock.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{\"model\":")           # then hang up mid-body
        time.sleep(0.2)

    def hung_up() -> float:
        text = httpx.get(f"http://127.0.0.1:{gw.http_port}/metrics", trust_env=False).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("routerkt_http_requests_total{") and 'status="499"' in line)
    wait_for(lambda: hung_up() >= 3, 10, "three hang-ups counted")
    assert not [r for r in caplog.records if r.exc_info or "No response returned" in r.getMessage()]
    assert len([r for r in caplog.records if "hung up" in r.getMessage()]) <= 1
