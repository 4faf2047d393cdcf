"""The gateway in front of a REAL tritonserver serving the tiny RouterKT model of `kt_repository`
(one Triton + one gateway for the whole module): probabilities equal PyTorch's, errors carry their
code and field, 1000 random requests never produce INTERNAL/UNKNOWN, deadlines and the in-flight
limit hold, metrics/HTTP/CLI work, and a killed python stub is detected and reloaded."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from serving.metrics import Metrics
from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.server import ThreadedGateway
from serving.settings import Settings

from tests.helpers import wait_for

pytestmark = pytest.mark.e2e

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
WINDOW = 20                     # TINY_OVERRIDES in tests/conftest.py
UNKNOWN_QUESTION = 10**12
UNKNOWN_SKILL = 10**12 + 5        # a skill the platform added after the model was trained: the unknown id


def gateway_settings(kt_repository, triton, **overrides) -> Settings:
    values = dict(repository=kt_repository.path, triton_url=triton.grpc_url, grpc_port=0, http_port=0,
                  probe_interval_s=0.5, probe_timeout_s=10.0, reload_cooldown_s=1.0, grace_period_s=2.0)  # 10 s: CPU contention is not a crash
    values.update(overrides)
    return Settings(**values)


def health_status(channel: grpc.Channel, service: str = "") -> int | None:
    try:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                         timeout=2.0).status
    except grpc.RpcError:
        return None


@pytest.fixture(scope="module")
def gateway(kt_repository, triton):
    gw = ThreadedGateway(gateway_settings(kt_repository, triton), Metrics()).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}")
    try:
        wait_for(lambda: health_status(channel) == health_pb2.HealthCheckResponse.SERVING, 30, "SERVING")
        yield gw, channel
    finally:
        channel.close()
        gw.stop(grace=2.0)


@pytest.fixture(scope="module")
def stub(gateway) -> pb_grpc.KnowledgeTracingServiceStub:
    return pb_grpc.KnowledgeTracingServiceStub(gateway[1])


@pytest.fixture(scope="module")
def checkpoint(kt_repository):
    from training.checkpoint import load_checkpoint
    from training.training_run import best_fold_dir
    return load_checkpoint(best_fold_dir(kt_repository.run))


@pytest.fixture(scope="module")
def raw_ids(checkpoint) -> tuple[list[int], list[int]]:
    return sorted(checkpoint.vocab.questions), sorted(checkpoint.vocab.skills)


def torch_probabilities(checkpoint, history, candidates) -> np.ndarray:
    """The reference, built independently of serving/encoder/window.py: left-padded rows, PyTorch model."""
    vocab = checkpoint.vocab

    def skill_id(question: int, skill: int | None) -> int:
        raw = vocab.question_skill.get(question, -1) if skill is None else skill
        return vocab.skills.get(raw, 1)
    used = history[-(WINDOW - 1):]
    pad = WINDOW - 1 - len(used)
    rows_q, rows_s, rows_r = [], [], []
    for question, skill in candidates:
        rows_q.append([0] * pad + [vocab.questions.get(q, 1) for q, _, _ in used] + [vocab.questions.get(question, 1)])
        rows_s.append([0] * pad + [skill_id(q, s) for q, s, _ in used] + [skill_id(question, skill)])
        rows_r.append([-1] * pad + [c for _, _, c in used] + [0])
    tensors = [torch.tensor(rows, dtype=torch.int64) for rows in (rows_q, rows_s, rows_r)]
    with torch.no_grad():
        return torch.sigmoid(checkpoint.model(*tensors).logits)[:, -1].numpy()


def make_request(history, candidates, model="kt", version=0) -> pb.PredictRequest:
    return pb.PredictRequest(
        model=model, version=version,
        history=[pb.Interaction(question_id=q, correct=c, **({} if s is None else {"skill_id": s})) for q, s, c in history],
        candidates=[pb.Candidate(question_id=q, **({} if s is None else {"skill_id": s})) for q, s in candidates])


def learner_history(checkpoint, raw_ids, n: int, seed: int) -> list[tuple[int, int | None, int]]:
    rng = np.random.default_rng(seed)
    questions = rng.choice(raw_ids[0], size=n)
    out = []
    for i, q in enumerate(questions.tolist()):
        skill = None if i % 3 == 0 else checkpoint.vocab.question_skill.get(q, -1) if i % 7 else UNKNOWN_SKILL
        out.append((q, skill, int(rng.integers(0, 2))))
    return out


def candidates_for(checkpoint, raw_ids) -> list[tuple[int, int | None]]:
    q = raw_ids[0]
    return [(q[0], None), (q[5], checkpoint.vocab.question_skill[q[5]]), (q[-1], -1),
            (UNKNOWN_QUESTION, raw_ids[1][0]), (UNKNOWN_QUESTION + 1, None), (q[1], UNKNOWN_SKILL)]


@pytest.mark.parametrize("n_history", [5, 0, 50])
def test_probabilities_equal_pytorch(stub, checkpoint, raw_ids, n_history: int) -> None:
    history = learner_history(checkpoint, raw_ids, n_history, seed=n_history)
    candidates = candidates_for(checkpoint, raw_ids)
    response = stub.Predict(make_request(history, candidates), timeout=10.0)
    expected = torch_probabilities(checkpoint, history, candidates)
    assert response.model == "kt" and response.version == 1
    assert response.history_used == min(n_history, WINDOW - 1)
    np.testing.assert_allclose(np.asarray(response.probabilities), expected, atol=1e-5, rtol=0)


def test_batch_equals_individual_predicts(stub, checkpoint, raw_ids) -> None:
    learners = [(learner_history(checkpoint, raw_ids, n, seed=n), candidates_for(checkpoint, raw_ids)[: 1 + n % 5])
                for n in (0, 3, 19, 40)]
    batch = pb.PredictBatchRequest(model="kt", learners=[
        pb.LearnerRequest(history=make_request(h, c).history, candidates=make_request(h, c).candidates)
        for h, c in learners])
    together = stub.PredictBatch(batch, timeout=10.0)
    assert together.model == "kt" and together.version == 1 and len(together.results) == len(learners)
    for (history, candidates), result in zip(learners, together.results):
        alone = stub.Predict(make_request(history, candidates), timeout=10.0)
        np.testing.assert_allclose(result.probabilities, alone.probabilities, atol=1e-6, rtol=0)
        assert result.history_used == alone.history_used
        np.testing.assert_allclose(result.probabilities, torch_probabilities(checkpoint, history, candidates),
                                   atol=1e-5, rtol=0)


def bad_requests(raw_ids):
    q, s = raw_ids
    good_h = (q[0], s[0], 1)
    return [
        (make_request([good_h], [(q[1], None)], model=""), grpc.StatusCode.INVALID_ARGUMENT, "model"),
        (make_request([good_h], [(q[1], None)], version=-2), grpc.StatusCode.INVALID_ARGUMENT, "version"),
        (make_request([good_h], []), grpc.StatusCode.INVALID_ARGUMENT, "candidates"),
        (make_request([good_h], [(q[1], None)] * 65), grpc.StatusCode.INVALID_ARGUMENT, "candidates"),
        (make_request([good_h] * 10001, [(q[1], None)]), grpc.StatusCode.INVALID_ARGUMENT, "history"),
        (make_request([good_h, (q[0], s[0], 2)], [(q[1], None)]), grpc.StatusCode.INVALID_ARGUMENT, "history[1].correct"),
        (make_request([(-4, s[0], 1)], [(q[1], None)]), grpc.StatusCode.INVALID_ARGUMENT, "history[0].question_id"),
        (make_request([(q[0], -7, 0)], [(q[1], None)]), grpc.StatusCode.INVALID_ARGUMENT, "history[0].skill_id"),
        (make_request([good_h], [(q[1], None), (-1, None)]), grpc.StatusCode.INVALID_ARGUMENT, "candidates[1].question_id"),
        (make_request([good_h], [(q[1], None)], model="no-such-model"), grpc.StatusCode.NOT_FOUND, "model"),
        (make_request([good_h], [(q[1], None)], version=42), grpc.StatusCode.NOT_FOUND, "version"),
    ]


def test_every_bad_input_gets_its_code_and_field(stub, raw_ids) -> None:
    for request, code, field in bad_requests(raw_ids):
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(request, timeout=10.0)
        assert info.value.code() is code, (field, info.value.details())
        assert field in info.value.details()
        assert dict(info.value.trailing_metadata())["routerkt-field"] == field
        assert "Traceback" not in info.value.details() and "/" not in info.value.details().split(":")[0]


def test_batch_limits(stub) -> None:
    learner = pb.LearnerRequest(candidates=[pb.Candidate(question_id=1)])
    for learners, field in (([], "learners"), ([learner] * 65, "learners")):
        with pytest.raises(grpc.RpcError) as info:
            stub.PredictBatch(pb.PredictBatchRequest(model="kt", learners=learners), timeout=10.0)
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT and field in info.value.details()


# -- random requests ------------------------------------------------------------------------------
def valid_requests(raw_ids, model=st.just("kt"), version=st.sampled_from([0, 1])):
    """Requests the gateway must answer OK: known or unknown questions, known / absent / -1 / unknown
    skills (with the served model and version; other `model` / `version` strategies address others)."""
    q, s = raw_ids
    question = st.one_of(st.sampled_from(q), st.integers(0, 2**63 - 1))
    skill = st.one_of(st.none(), st.sampled_from(s), st.just(-1), st.integers(0, 2**63 - 1))
    history = st.lists(st.tuples(question, skill, st.sampled_from([0, 1])), max_size=30)
    candidates = st.lists(st.tuples(question, skill), min_size=1, max_size=6)
    return st.builds(make_request, history, candidates, model, version)


def misaddressed_requests(raw_ids):
    """Valid requests for a model or a version the repository lacks: NOT_FOUND."""
    return st.one_of(valid_requests(raw_ids, model=st.sampled_from(["nope", "no-such-model"])),
                     valid_requests(raw_ids, version=st.integers(100, 10**6)))


def random_requests(raw_ids):
    """Anything: out-of-range ids and answers, unknown skills, empty lists, bad model / version."""
    q, s = raw_ids
    question = st.one_of(st.sampled_from(q), st.integers(-3, 2**63 - 1), st.just(UNKNOWN_QUESTION))
    skill = st.one_of(st.none(), st.sampled_from(s), st.sampled_from([-1, -2, 0, 10**6]),
                      st.integers(-(2**63), 2**63 - 1))
    correct = st.sampled_from([0, 1, 0, 1, 2, -1, 2**31 - 1])
    history = st.lists(st.tuples(question, skill, correct), max_size=30)
    candidates = st.lists(st.tuples(question, skill), max_size=6)
    model = st.sampled_from(["kt", "kt", "kt", "", "nope"])
    version = st.sampled_from([0, 0, 1, 2, -1])
    return st.builds(make_request, history, candidates, model, version)


def predict_requests(raw_ids):
    return st.one_of(valid_requests(raw_ids), random_requests(raw_ids), misaddressed_requests(raw_ids))


@hsettings(max_examples=1000, deadline=None, database=None,
           suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_requests_never_fail_internally(gateway, stub, raw_ids, data) -> None:
    request = data.draw(predict_requests(raw_ids))
    as_batch = data.draw(st.booleans().map(lambda b: b and data.draw(st.integers(0, 3)) == 0))
    try:
        if as_batch:
            batch = pb.PredictBatchRequest(model=request.model, version=request.version, learners=[
                pb.LearnerRequest(history=request.history, candidates=request.candidates)] * 2)
            response = stub.PredictBatch(batch, timeout=10.0)
            probabilities = [p for r in response.results for p in r.probabilities]
            assert len(probabilities) == 2 * len(request.candidates)
        else:
            probabilities = list(stub.Predict(request, timeout=10.0).probabilities)
            assert len(probabilities) == len(request.candidates)
        assert all(0.0 < p < 1.0 for p in probabilities)
    except grpc.RpcError as exc:
        assert exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), (exc.code(), exc.details())


def test_server_is_healthy_after_the_random_requests(gateway, stub, raw_ids) -> None:
    assert health_status(gateway[1]) == health_pb2.HealthCheckResponse.SERVING
    response = stub.Predict(make_request([(raw_ids[0][0], None, 1)], [(raw_ids[0][1], None)]), timeout=10.0)
    assert len(response.probabilities) == 1
    registry = gateway[0].server.metrics.registry

    def handled(code: str) -> float:
        return sum(registry.get_sample_value("grpc_server_handled_total", {
            "grpc_service": "routerkt.v1.KnowledgeTracingService", "grpc_method": method, "grpc_type": "unary",
            "grpc_code": code}) or 0.0 for method in ("Predict", "PredictBatch"))
    assert handled("OK") >= 100 and handled("INVALID_ARGUMENT") >= 100 and handled("NOT_FOUND") >= 100   # a real mix
    for code in ("INTERNAL", "UNKNOWN"):
        for method in ("Predict", "PredictBatch"):
            assert registry.get_sample_value("grpc_server_handled_total", {
                "grpc_service": "routerkt.v1.KnowledgeTracingService", "grpc_method": method,
                "grpc_type": "unary", "grpc_code": code}) is None


# -- deadlines and backpressure -------------------------------------------------------------------
def heavy_batch(raw_ids, learners: int = 64, candidates: int = 64) -> pb.PredictBatchRequest:
    q = raw_ids[0]
    history = [pb.Interaction(question_id=q[i % len(q)], correct=i % 2) for i in range(30)]
    learner = pb.LearnerRequest(history=history, candidates=[pb.Candidate(question_id=q[i % len(q)])
                                                             for i in range(candidates)])
    return pb.PredictBatchRequest(model="kt", learners=[learner] * learners)


def test_tiny_deadlines_give_deadline_exceeded(gateway, stub, raw_ids) -> None:
    request = make_request([(raw_ids[0][0], None, 1)], [(raw_ids[0][1], None)])
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(request, timeout=0.0005)
    assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    with pytest.raises(grpc.RpcError) as info:
        stub.PredictBatch(heavy_batch(raw_ids), timeout=0.02)          # ~350 ms of work: expires inside
    assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    stub.Predict(request, timeout=10.0)                                  # still serving


def test_small_calls_get_turns_beside_maximal_batches(stub, raw_ids) -> None:
    """The defect behind issue 16: one legal maximal PredictBatch (64 learners x 64 candidates x
    1,000 interactions) made 20 of 24 small 2 s-deadline calls fail. Now a batch's rank inferences go
    to the one model instance one at a time, yielding turns to the calls in flight: every small call
    made while maximal batches run succeeds, as does every batch, and the small caller gets turns
    all along (sent as one 64-row inference, as before, a batch let through a call or two)."""
    q = raw_ids[0]
    history = pb.HistoryColumns(question_ids=[q[i % len(q)] for i in range(1000)], correct=[i % 2 for i in range(1000)])
    asked = [pb.Candidate(question_id=q[(3 * j) % len(q)]) for j in range(64)]
    maximal = pb.PredictBatchRequest(model="kt", learners=[pb.LearnerRequest(history_columns=history, candidates=asked)] * 64)
    small = pb.PredictRequest(model="kt", history_columns=pb.HistoryColumns(
        question_ids=history.question_ids[:30], correct=history.correct[:30]), candidates=asked[:1])
    batches: list = []
    big = threading.Thread(target=lambda: batches.extend(stub.PredictBatch(maximal, timeout=60.0) for _ in range(2)))
    big.start()
    codes = []
    while big.is_alive():
        try:
            stub.Predict(small, timeout=2.0)
            codes.append("OK")
        except grpc.RpcError as exc:
            codes.append(exc.code().name)
    big.join()
    assert set(codes) == {"OK"} and len(codes) >= 32, codes      # 2 batches = 128 turns of the model
    assert len(batches) == 2 and all(len(b.results) == 64 and len(b.results[0].probabilities) == 64 for b in batches)


def test_inflight_limit_gives_resource_exhausted(kt_repository, triton, raw_ids) -> None:
    gw = ThreadedGateway(gateway_settings(kt_repository, triton, max_inflight=1, inflight_wait_s=0.0), Metrics()).start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}") as channel:
            wait_for(lambda: health_status(channel) == health_pb2.HealthCheckResponse.SERVING, 30, "SERVING")
            limited = pb_grpc.KnowledgeTracingServiceStub(channel)
            request = heavy_batch(raw_ids, learners=16)

            def call(_: int) -> grpc.StatusCode:
                try:
                    limited.PredictBatch(request, timeout=30.0)
                    return grpc.StatusCode.OK
                except grpc.RpcError as exc:
                    return exc.code()
            with ThreadPoolExecutor(8) as pool:
                codes = list(pool.map(call, range(8)))
        assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes and grpc.StatusCode.OK in codes
        assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
    finally:
        gw.stop(grace=2.0)


# -- metrics, HTTP, CLI -----------------------------------------------------------------------------
def test_metrics_after_traffic(gateway, stub, raw_ids) -> None:
    stub.Predict(make_request([(raw_ids[0][0], None, 1)], [(UNKNOWN_QUESTION, None)]), timeout=10.0)
    text = httpx.get(f"http://127.0.0.1:{gateway[0].http_port}/metrics", timeout=10.0, trust_env=False).text
    service = 'grpc_service="routerkt.v1.KnowledgeTracingService"'
    for needle in (
        f'grpc_server_started_total{{grpc_method="Predict",{service},grpc_type="unary"}}',
        f'grpc_server_handled_total{{grpc_code="OK",grpc_method="Predict",{service},grpc_type="unary"}}',
        f'grpc_server_handled_total{{grpc_code="INVALID_ARGUMENT",grpc_method="Predict",{service},grpc_type="unary"}}',
        f'grpc_server_handled_total{{grpc_code="NOT_FOUND",grpc_method="Predict",{service},grpc_type="unary"}}',
        f'grpc_server_handling_seconds_bucket{{grpc_method="Predict",{service},grpc_type="unary",le="0.005"}}',
        'routerkt_triton_request_seconds_bucket{le="0.01",model="kt",version="', 'routerkt_build_info{git_sha="',
        'routerkt_history_length_bucket{le="20.0"}', 'routerkt_candidates_per_call_bucket{le="64.0"}',
        'routerkt_unknown_ids_total{kind="question"}', 'routerkt_unknown_ids_total{kind="skill"}',
        'routerkt_errors_total{code="INVALID_ARGUMENT"}', 'routerkt_errors_total{code="NOT_FOUND"}',
        "routerkt_inflight_requests 0.0", 'routerkt_model_ready{model="kt"} 1.0', "routerkt_triton_ready 1.0",
    ):
        assert needle in text, needle


def test_http_mirror_health_and_openapi(gateway, stub, checkpoint, raw_ids) -> None:
    history = learner_history(checkpoint, raw_ids, 7, seed=7)
    candidates = candidates_for(checkpoint, raw_ids)
    grpc_answer = stub.Predict(make_request(history, candidates), timeout=10.0)
    body = {"model": "kt",
            "history": [{"question_id": q, "correct": c, **({} if s is None else {"skill_id": s})} for q, s, c in history],
            "candidates": [{"question_id": q, **({} if s is None else {"skill_id": s})} for q, s in candidates]}
    with httpx.Client(base_url=f"http://127.0.0.1:{gateway[0].http_port}", timeout=10.0, trust_env=False) as http:
        answer = http.post("/v1/predict", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["probabilities"] == list(grpc_answer.probabilities)
        assert answer.json()["history_used"] == 7 and answer.json()["version"] == 1
        batch = http.post("/v1/predict_batch", json={"model": "kt", "learners": [
            {"history": body["history"], "candidates": body["candidates"]}]})
        assert batch.status_code == 200
        np.testing.assert_allclose(batch.json()["results"][0]["probabilities"], grpc_answer.probabilities, atol=1e-6)
        assert http.post("/v1/predict", json={**body, "version": 9}).status_code == 404
        bad = http.post("/v1/predict", json={**body, "candidates": [{"question_id": 1, "skill_id": -2}]})
        assert bad.status_code == 400 and bad.json()["error"]["field"] == "candidates[0].skill_id"
        slow = http.post("/v1/predict_batch", json={"model": "kt", "learners": [
            {"history": body["history"], "candidates": body["candidates"] * 10}] * 64},
            headers={"X-Request-Timeout": "0.001"})
        assert slow.status_code == 504 and slow.json()["error"]["code"] == "DEADLINE_EXCEEDED"
        assert http.get("/livez").status_code == 200
        ready = http.get("/readyz")
        assert ready.status_code == 200 and ready.json()["models"] == {"kt": [1]}
        paths = http.get("/openapi.json").json()["paths"]
        assert {"/v1/predict", "/v1/predict_batch", "/metrics", "/livez", "/readyz"} <= set(paths)


def routerkt(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "routerkt.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_cli_predict(gateway, stub, checkpoint, raw_ids) -> None:
    target = f"127.0.0.1:{gateway[0].grpc_port}"
    q = raw_ids[0]
    skill = checkpoint.vocab.question_skill[q[2]]
    out = routerkt("predict", "--target", target, "--model", "kt", "--history", f"{q[2]}:{skill}:1,{q[3]}::0",
                   "--candidates", f"{q[4]},{q[5]}:{checkpoint.vocab.question_skill[q[5]]}", "--json")
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    expected = stub.Predict(make_request([(q[2], skill, 1), (q[3], None, 0)],
                                         [(q[4], None), (q[5], checkpoint.vocab.question_skill[q[5]])]), timeout=10.0)
    assert answer["candidates"] == [q[4], q[5]] and answer["history_used"] == 2
    np.testing.assert_allclose(answer["probabilities"], expected.probabilities, atol=1e-6)
    plain = routerkt("predict", "--target", target, "--model", "kt", "--candidates", str(q[4]))
    assert plain.returncode == 0 and "P(correct)" in plain.stdout
    bad = routerkt("predict", "--target", target, "--model", "kt", "--candidates", "1", "--history", "1:2")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    missing = routerkt("predict", "--target", target, "--model", "no-such", "--candidates", "1")
    assert missing.returncode == 1 and missing.stderr.strip().splitlines() == [
        "routerkt predict: NOT_FOUND: model: unknown model 'no-such'"]


# -- stub crash (last: it reloads the model) -------------------------------------------------------
def test_killed_stub_is_detected_and_the_model_reloaded(gateway, stub, triton, raw_ids) -> None:
    registry = gateway[0].server.metrics.registry
    before = registry.get_sample_value("routerkt_model_reloads_total", {"model": "kt", "reason": "stub_crash"}) or 0.0
    stubs = triton.stub_pids()
    assert stubs
    for pid in stubs:
        os.kill(pid, signal.SIGKILL)
    request = make_request([(raw_ids[0][0], None, 1)], [(raw_ids[0][1], None)])
    codes = []

    def answered() -> bool:
        try:
            stub.Predict(request, timeout=5.0)
            return True
        except grpc.RpcError as exc:
            codes.append(exc.code())
            return False
    wait_for(answered, 60, "Predict to succeed again after the stub was killed", step=0.2)
    assert codes and set(codes) == {grpc.StatusCode.UNAVAILABLE}, codes
    after = registry.get_sample_value("routerkt_model_reloads_total", {"model": "kt", "reason": "stub_crash"})
    assert after is not None and after >= before + 1
    assert set(triton.stub_pids()).isdisjoint(stubs)
    wait_for(lambda: health_status(gateway[1]) == health_pb2.HealthCheckResponse.SERVING, 30, "SERVING again")
