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
from serving.triton_launcher import free_port

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
     grpc.StatusCode.UNAVAILABLE, None),                    # the model is known; vocab checks need it ready
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
    call_error(stub(gateway).Predict, valid_request(model=""))
    call_error(stub(gateway).Predict, valid_request(model="unknown-model"))
    text = gateway[2].get("/metrics").text
    for code in ("INVALID_ARGUMENT", "NOT_FOUND", "UNAVAILABLE"):
        assert (f'grpc_server_handled_total{{grpc_code="{code}",grpc_method="Predict",'
                f'grpc_service="{SERVICE_NAME}",grpc_type="unary"}}') in text, code
    assert 'routerkt_errors_total{code="INVALID_ARGUMENT"}' in text
    assert "routerkt_triton_ready 0.0" in text
    assert 'grpc_server_started_total{grpc_method="Predict"' in text


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
