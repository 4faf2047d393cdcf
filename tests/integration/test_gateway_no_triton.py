"""The real gateway over gRPC and HTTP loopback with NO Triton behind it (its Triton URL points at a
closed port): validation, NOT_FOUND, UNAVAILABLE, message-size limit, health, reflection, metrics
and the HTTP mirror all work without the model server."""
from __future__ import annotations

from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from serving.metrics import Metrics
from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.server import ThreadedGateway
from serving.settings import SERVICE_NAME, Settings
from serving.processes import free_port

pytestmark = pytest.mark.integration

MAX_MESSAGE = 64 * 1024


@pytest.fixture(scope="module")
def gateway(handmade_repository: Path):
    settings = Settings(repository=handmade_repository, triton_url=f"127.0.0.1:{free_port()}", grpc_port=0,
                        http_port=0, probe_interval_s=0.5, probe_timeout_s=0.5, max_message_bytes=MAX_MESSAGE,
                        grace_period_s=1.0)
    gw = ThreadedGateway(settings, Metrics()).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}")
    http = httpx.Client(base_url=f"http://127.0.0.1:{gw.http_port}", timeout=10.0, trust_env=False)
    try:
        yield gw, channel, http
    finally:
        http.close()
        channel.close()
        gw.stop(grace=1.0)


def stub(gateway) -> pb_grpc.KnowledgeTracingServiceStub:
    return pb_grpc.KnowledgeTracingServiceStub(gateway[1])


def call_error(function, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        function(request, timeout=5.0)
    return info.value


def field_of(error: grpc.RpcError) -> str | None:
    return dict(error.trailing_metadata() or ()).get("routerkt-field")


def valid_request(**overrides) -> pb.PredictRequest:
    fields = {"model": "kt", "history": [pb.Interaction(question_id=100, skill_id=7, correct=1)],
              "candidates": [pb.Candidate(question_id=101)]}
    fields.update(overrides)
    return pb.PredictRequest(**fields)


def test_health_is_not_serving_without_triton(gateway) -> None:
    health = health_pb2_grpc.HealthStub(gateway[1])
    for service in ("", SERVICE_NAME):
        answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5.0)
        assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING


def test_valid_request_is_unavailable_not_internal(gateway) -> None:
    error = call_error(stub(gateway).Predict, valid_request())
    assert error.code() is grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("request_, code, field", [
    (valid_request(model=""), grpc.StatusCode.INVALID_ARGUMENT, "model"),
    (valid_request(candidates=[]), grpc.StatusCode.INVALID_ARGUMENT, "candidates"),
    (valid_request(history=[pb.Interaction(question_id=100, correct=5)]), grpc.StatusCode.INVALID_ARGUMENT,
     "history[0].correct"),
    (valid_request(history=[pb.Interaction(question_id=100, skill_id=999, correct=1)]),
     grpc.StatusCode.UNAVAILABLE, None),                    # a skill the model lacks is no error; it is not ready
    (valid_request(model="unknown-model"), grpc.StatusCode.NOT_FOUND, "model"),
    (valid_request(version=5), grpc.StatusCode.NOT_FOUND, "version"),
])
def test_errors_over_grpc(gateway, request_, code, field) -> None:
    error = call_error(stub(gateway).Predict, request_)
    assert error.code() is code
    assert field_of(error) == field
    if field:
        assert field in error.details()


def test_oversized_message_is_resource_exhausted(gateway) -> None:
    history = [pb.Interaction(question_id=100, skill_id=7, correct=1)] * 20000     # ~200 kB > 64 kB
    error = call_error(stub(gateway).Predict, valid_request(history=history))
    assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED


def test_batch_errors_name_the_learner(gateway) -> None:
    good = pb.LearnerRequest(candidates=[pb.Candidate(question_id=100)])
    bad = pb.LearnerRequest(candidates=[pb.Candidate(question_id=-1)])
    error = call_error(stub(gateway).PredictBatch, pb.PredictBatchRequest(model="kt", learners=[good, bad]))
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT and field_of(error) == "learners[1].candidates[0].question_id"


def test_reflection_lists_the_services(gateway) -> None:
    reflection = reflection_pb2_grpc.ServerReflectionStub(gateway[1])
    answers = reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                              timeout=5.0)
    names = {s.name for answer in answers for s in answer.list_services_response.service}
    assert {SERVICE_NAME, "grpc.health.v1.Health"} <= names


def test_metrics_count_every_code(gateway) -> None:
    """Each code from a call of this test's own (no other test's calls needed: it passes alone)."""
    assert call_error(stub(gateway).Predict, valid_request(model="")).code() is grpc.StatusCode.INVALID_ARGUMENT
    assert call_error(stub(gateway).Predict, valid_request(model="unknown-model")).code() is grpc.StatusCode.NOT_FOUND
    assert call_error(stub(gateway).Predict, valid_request()).code() is grpc.StatusCode.UNAVAILABLE
    text = gateway[2].get("/metrics").text
    for code in ("INVALID_ARGUMENT", "NOT_FOUND", "UNAVAILABLE"):
        assert (f'grpc_server_handled_total{{grpc_code="{code}",grpc_method="Predict",'
                f'grpc_service="{SERVICE_NAME}",grpc_type="unary"}}') in text, code
    assert 'routerkt_errors_total{code="INVALID_ARGUMENT"}' in text
    assert "routerkt_triton_ready 0.0" in text
    assert 'grpc_server_started_total{grpc_method="Predict"' in text


def test_metrics_count_health_checks_and_undecodable_bodies(gateway) -> None:
    """grpc_server_* is counted by the handlers as registered (serving/metrics/grpc_calls.py), so the health
    service's calls and a body refused before the servicer count too, each once."""
    def handled(text: str, service: str, method: str, code: str) -> float:
        prefix = (f'grpc_server_handled_total{{grpc_code="{code}",grpc_method="{method}",grpc_service="{service}",'
                  'grpc_type="unary"}')
        line = next((l for l in text.splitlines() if l.startswith(prefix)), None)
        return float(line.rsplit(" ", 1)[1]) if line else 0.0
    before = gateway[2].get("/metrics").text
    for _ in range(3):
        health_pb2_grpc.HealthStub(gateway[1]).Check(health_pb2.HealthCheckRequest(), timeout=5.0)
    garbage = gateway[1].unary_unary(f"/{SERVICE_NAME}/Predict", request_serializer=None,
                                      response_deserializer=None)
    with pytest.raises(grpc.RpcError) as info:
        garbage(b"\xff\xff\xff", timeout=5.0)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    after = gateway[2].get("/metrics").text
    assert handled(after, "grpc.health.v1.Health", "Check", "OK") - handled(before, "grpc.health.v1.Health",
                                                                               "Check", "OK") == 3
    assert handled(after, SERVICE_NAME, "Predict", "INVALID_ARGUMENT") - handled(
        before, SERVICE_NAME, "Predict", "INVALID_ARGUMENT") == 1


def test_http_health_and_json_errors(gateway) -> None:
    http = gateway[2]
    assert http.get("/livez").status_code == 200
    ready = http.get("/readyz")
    assert ready.status_code == 503 and ready.json()["ready"] is False
    body = {"model": "kt", "history": [{"question_id": 100, "skill_id": 7, "correct": 2}],
            "candidates": [{"question_id": 101}]}
    answer = http.post("/v1/predict", json=body)
    assert answer.status_code == 400 and answer.json()["error"]["field"] == "history[0].correct"
    body["history"][0]["correct"] = "yes"
    answer = http.post("/v1/predict", json=body)
    assert answer.status_code == 400 and answer.json()["error"]["field"] == "history[0].correct"
    body["history"][0]["correct"] = 1
    assert http.post("/v1/predict", json=body).status_code == 503
    assert http.post("/v1/predict", json={**body, "model": "nope"}).status_code == 404
    assert http.post("/v1/predict", json={**body, "version": 2**70}).status_code == 400
    answer = http.post("/v1/predict", content=b"{not json", headers={"content-type": "application/json"})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "INVALID_ARGUMENT"
    answer = http.post("/v1/predict", json=body, headers={"X-Request-Timeout": "soon"})
    assert answer.status_code == 400 and answer.json()["error"]["field"] == "X-Request-Timeout"
    answer = http.post("/v1/predict_batch", json={"model": "kt", "learners": []})
    assert answer.status_code == 400 and answer.json()["error"]["field"] == "learners"


def test_openapi_lists_the_paths(gateway) -> None:
    paths = gateway[2].get("/openapi.json").json()["paths"]
    assert {"/v1/predict", "/v1/predict_batch", "/metrics", "/livez", "/readyz"} <= set(paths)
    assert "400" in paths["/v1/predict"]["post"]["responses"]


# -- request bodies the gateway decodes itself -------------------------------------------------------
RPCS = ("Predict", "PredictBatch", "Observe", "ForgetLearner")


def raw_call(gateway, method: str, body: bytes) -> grpc.RpcError | bytes:
    call = gateway[1].unary_unary(f"/routerkt.v1.KnowledgeTracingService/{method}")   # bytes in, bytes out
    try:
        return call(body, timeout=5.0)
    except grpc.RpcError as exc:
        return exc


@pytest.mark.parametrize("method", RPCS)
@pytest.mark.parametrize("body", [b"\xff\xff\xff", b"\x0a\x05kt", b"\x0a\x02\xc3\x28",   # garbage, truncated, bad UTF-8
                                  valid_request().SerializeToString()[:-3]])
def test_undecodable_bodies_are_invalid_argument_with_a_plain_message(gateway, method: str, body: bytes) -> None:
    error = raw_call(gateway, method, body)
    assert isinstance(error, grpc.RpcError) and error.code() is grpc.StatusCode.INVALID_ARGUMENT, error
    assert error.details().startswith("body: the request body is not a valid ")
    assert "Error" not in error.details() and "<class" not in error.details() and ".py" not in error.details()
    text = gateway[2].get("/metrics").text
    assert f'routerkt_undecodable_requests_total{{method="{method}"}}' in text


def test_fuzzed_bodies_never_answer_unknown_or_internal(gateway) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    seeds = [valid_request().SerializeToString(), pb.ObserveRequest(learner_id="x", events=[
        pb.Event(event_id="e", question_id=1, correct=1)]).SerializeToString()]

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(method=st.sampled_from(RPCS), seed=st.sampled_from(seeds), cut=st.integers(0, 64),
           flips=st.lists(st.tuples(st.integers(0, 63), st.integers(0, 255)), max_size=4),
           junk=st.binary(max_size=32))
    def probe(method, seed, cut, flips, junk):
        body = bytearray(seed[:cut] + junk)
        for at, value in flips:
            if body:
                body[at % len(body)] = value
        outcome = raw_call(gateway, method, bytes(body))
        if isinstance(outcome, grpc.RpcError):
            assert outcome.code() not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), outcome
    probe()
    health = health_pb2_grpc.HealthStub(gateway[1]).Check(health_pb2.HealthCheckRequest(), timeout=5.0)
    assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING          # alive, answering (no Triton here)


# -- the HTTP mirror's input rules -------------------------------------------------------------------
@pytest.mark.parametrize("body, field", [
    ({"model": "kt", "candidates": [{"question_id": False}]}, "candidates[0].question_id"),
    ({"model": "kt", "candidates": [{"question_id": "12"}]}, "candidates[0].question_id"),
    ({"model": "kt", "candidates": [{"question_id": 1.0}]}, "candidates[0].question_id"),
    ({"model": "kt", "candidates": [{"question_id": 1}], "history": [{"question_id": 1, "correct": True}]},
     "history[0].correct"),
])
def test_http_integers_are_strict(gateway, body, field) -> None:
    answer = gateway[2].post("/v1/predict", json=body)
    assert answer.status_code == 400 and answer.json()["error"]["field"] == field


def test_http_lone_surrogates_and_invalid_utf8_are_400(gateway) -> None:
    answer = gateway[2].post("/v1/predict", content=b'{"model": "\\ud800", "candidates": [{"question_id": 1}]}',
                             headers={"content-type": "application/json"})
    assert answer.status_code == 400 and answer.json()["error"]["field"] == "model"
    answer = gateway[2].post("/v1/predict", content=b'{"model": "\xff", "candidates": []}',
                             headers={"content-type": "application/json"})
    assert answer.status_code == 400


def test_http_chunked_bodies_over_the_limit_are_413(gateway) -> None:
    limit = MAX_MESSAGE * 4

    def chunks():
        yield b'{"model": "kt", "candidates": [' + b'{"question_id": 1},' * (limit // 18)
        yield b'{"question_id": 1}]}'
    answer = gateway[2].post("/v1/predict", content=chunks(), headers={"content-type": "application/json"})
    assert answer.status_code == 413 and answer.json()["error"]["field"] == "body"


def test_http_a_body_shorter_than_its_content_length_gets_408_not_a_hang(handmade_repository) -> None:
    import socket
    settings = Settings(repository=handmade_repository, triton_url=f"127.0.0.1:{free_port()}", grpc_port=0,
                        http_port=0, http_body_timeout_s=0.5, grace_period_s=1.0)
    with ThreadedGateway(settings, Metrics()) as gw:
        with socket.create_connection(("127.0.0.1", gw.http_port), timeout=5.0) as sock:
            sock.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 500\r\n\r\n{\"model\": ")
            reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 408")


def test_http_huge_timeout_headers_are_capped_not_overflowing(gateway) -> None:
    body = {"model": "kt", "candidates": [{"question_id": 101}]}
    answer = gateway[2].post("/v1/predict", json=body, headers={"X-Request-Timeout": "9.2e18"})
    assert answer.status_code == 503                     # no Triton here: UNAVAILABLE, not an instant 504


def test_the_shipped_client_retries_unavailable_with_backoff(gateway) -> None:
    """No Triton here: every Predict is UNAVAILABLE; the client's policy makes RETRY_ATTEMPTS attempts."""
    from serving.client import RETRY_ATTEMPTS, connect

    def started() -> float:
        text = gateway[2].get("/metrics").text
        line = next((l for l in text.splitlines() if l.startswith("grpc_server_started_total{")
                     and 'grpc_method="Predict"' in l), None)
        return float(line.rsplit(" ", 1)[1]) if line else 0.0
    before = started()
    with connect(f"127.0.0.1:{gateway[0].grpc_port}") as channel:
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.KnowledgeTracingServiceStub(channel).Predict(valid_request(), timeout=10.0)
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    assert started() - before == RETRY_ATTEMPTS
    with pytest.raises(grpc.RpcError):
        stub(gateway).Predict(valid_request(), timeout=10.0)            # a plain channel: one attempt
    assert started() - before == RETRY_ATTEMPTS + 1
