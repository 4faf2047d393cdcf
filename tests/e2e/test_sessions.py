"""Learner sessions through the gateway with a real Triton and a real store (SQLite file, and a
redis-server process): Predict by learner_id equals Predict with the same explicit history,
Observe is idempotent and all-or-nothing, bad input names its field, ForgetLearner leaves nothing."""
from __future__ import annotations

import logging
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.core.catalog import ModelCatalog
from serving.metrics import Metrics
from serving.server import ThreadedGateway
from serving.sessions.keys import LearnerKeys
from serving.sessions.redis_server import RedisServer
from serving.sessions.factory import open_store
from serving.settings import Settings

pytestmark = pytest.mark.e2e

WINDOW = 20                     # TINY_OVERRIDES in tests/conftest.py
SECRET = b"e2e-session-secret-32-bytes-long"
RAW_ID = "learner-7f3a@school.example"


@pytest.fixture(scope="module", params=["sqlite", "redis"])
def gateway(request, kt_repository, triton, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"store-{request.param}")
    redis = RedisServer(folder / "redis").start() if request.param == "redis" else None
    url = redis.url if redis else f"sqlite:///{folder / 'sessions.sqlite3'}"
    settings = Settings(repository=kt_repository.path, triton_url=triton.grpc_url, grpc_port=0, http_port=0,
                        probe_interval_s=0.5, probe_timeout_s=10.0, grace_period_s=1.0, max_observe_events=50)
    metrics, catalog = Metrics(), ModelCatalog(kt_repository.path)
    gw = ThreadedGateway(settings, metrics, catalog=catalog, store=open_store(url), keys=LearnerKeys(SECRET)).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}")
    try:
        stub = pb_grpc.KnowledgeTracingServiceStub(channel)
        for _ in range(120):
            try:
                stub.Predict(pb.PredictRequest(model="kt", candidates=[pb.Candidate(question_id=1)]), timeout=5)
                break
            except grpc.RpcError:
                import time
                time.sleep(0.25)
        yield gw, stub, url
    finally:
        channel.close()
        gw.stop(grace=1.0)
        if redis:
            redis.stop()


def known_history(kt_repository, n: int, seed: int) -> list[tuple[int, int, int]]:
    from routerkt.contract.repository_reader import read_vocab
    vocab = read_vocab(kt_repository.path, "kt", 1)
    rng = np.random.default_rng(seed)
    questions = [q for q in sorted(vocab.questions) if vocab.question_skill.get(q, -1) in vocab.skills]
    return [(int(q), vocab.question_skill[int(q)], int(rng.integers(0, 2))) for q in rng.choice(questions, n)]


def observe(stub, learner: str, history, prefix: str = "e", start: int = 0) -> pb.ObserveResponse:
    events = [pb.Event(event_id=f"{prefix}{start + i}", question_id=q, skill_id=s, correct=c)
              for i, (q, s, c) in enumerate(history)]
    return stub.Observe(pb.ObserveRequest(learner_id=learner, events=events), timeout=10.0)


def code_and_field(call) -> tuple[grpc.StatusCode, str | None]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    field = dict(info.value.trailing_metadata() or ()).get("routerkt-field")
    return info.value.code(), field


@pytest.mark.parametrize("n", [5, 19, 45])
def test_predict_by_learner_id_equals_the_explicit_history(gateway, kt_repository, n: int) -> None:
    _, stub, _ = gateway
    learner = f"equal-{n}"
    stub.ForgetLearner(pb.ForgetLearnerRequest(learner_id=learner), timeout=10.0)
    history = known_history(kt_repository, n, seed=n)
    for start in range(0, n, 10):                                    # several Observe calls, in order
        chunk = history[start:start + 10]
        assert observe(stub, learner, chunk, start=start).stored == len(chunk)
    candidates = [pb.Candidate(question_id=q) for q, _, _ in known_history(kt_repository, 4, seed=99)]
    by_id = stub.Predict(pb.PredictRequest(model="kt", learner_id=learner, candidates=candidates), timeout=10.0)
    explicit = stub.Predict(pb.PredictRequest(model="kt", candidates=candidates, history=[
        pb.Interaction(question_id=q, skill_id=s, correct=c) for q, s, c in history]), timeout=10.0)
    assert by_id.history_used == explicit.history_used == min(n, WINDOW - 1)
    np.testing.assert_allclose(by_id.probabilities, explicit.probabilities, atol=1e-6, rtol=0)
    batch = stub.PredictBatch(pb.PredictBatchRequest(model="kt", learners=[
        pb.LearnerRequest(learner_id=learner, candidates=candidates), pb.LearnerRequest(candidates=candidates)]),
        timeout=10.0)
    np.testing.assert_allclose(batch.results[0].probabilities, explicit.probabilities, atol=1e-6, rtol=0)
    assert batch.results[1].history_used == 0                        # an explicit cold start beside it


def test_unknown_learner_is_a_cold_start(gateway) -> None:
    _, stub, _ = gateway
    candidates = [pb.Candidate(question_id=1)]
    by_id = stub.Predict(pb.PredictRequest(model="kt", learner_id="never-seen", candidates=candidates), timeout=10.0)
    cold = stub.Predict(pb.PredictRequest(model="kt", candidates=candidates), timeout=10.0)
    assert by_id.history_used == 0 and list(by_id.probabilities) == list(cold.probabilities)


def test_retried_observe_stores_nothing_twice_and_rejected_observe_stores_nothing(gateway, kt_repository) -> None:
    _, stub, _ = gateway
    learner = "retry"
    stub.ForgetLearner(pb.ForgetLearnerRequest(learner_id=learner), timeout=10.0)
    history = known_history(kt_repository, 6, seed=1)
    first = observe(stub, learner, history)
    again = observe(stub, learner, history)
    assert (first.stored, first.duplicates, first.history_length) == (6, 0, 6)
    assert (again.stored, again.duplicates, again.history_length) == (0, 6, 6)
    bad = [pb.Event(event_id="new-1", question_id=5, correct=1), pb.Event(event_id="new-2", question_id=5, correct=3)]
    code, field = code_and_field(lambda: stub.Observe(pb.ObserveRequest(learner_id=learner, events=bad), timeout=10))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and field == "events[1].correct"
    after = observe(stub, learner, history[:1])                       # the good event of the bad call was not stored
    assert (after.duplicates, after.history_length) == (1, 6)


@pytest.mark.parametrize("request_of, field", [
    (lambda: pb.ObserveRequest(events=[pb.Event(event_id="a", question_id=1, correct=1)]), "learner_id"),
    (lambda: pb.ObserveRequest(learner_id="x" * 129, events=[pb.Event(event_id="a", question_id=1, correct=1)]),
     "learner_id"),
    (lambda: pb.ObserveRequest(learner_id="x"), "events"),
    (lambda: pb.ObserveRequest(learner_id="x", events=[pb.Event(event_id=str(i), question_id=1, correct=1)
                                                        for i in range(51)]), "events"),
    (lambda: pb.ObserveRequest(learner_id="x", events=[pb.Event(event_id="a", question_id=1, correct=1),
                                                        pb.Event(event_id="a", question_id=2, correct=0)]),
     "events[1].event_id"),
    (lambda: pb.ObserveRequest(learner_id="x", events=[pb.Event(question_id=1, correct=1)]), "events[0].event_id"),
    (lambda: pb.ObserveRequest(learner_id="x", events=[pb.Event(event_id="a", question_id=1, correct=2)]),
     "events[0].correct"),
    (lambda: pb.ObserveRequest(learner_id="x", events=[pb.Event(event_id="a", question_id=-1, correct=1)]),
     "events[0].question_id"),
    (lambda: pb.ObserveRequest(learner_id="x", events=[pb.Event(event_id="a", question_id=1, skill_id=-5,
                                                                correct=1)]), "events[0].skill_id"),
    (lambda: pb.ObserveRequest(learner_id="x", events=[pb.Event(event_id="a", question_id=1, correct=1,
                                                                timestamp_ms=-3)]), "events[0].timestamp_ms"),
])
def test_bad_observe_requests_name_their_field(gateway, request_of, field) -> None:
    _, stub, _ = gateway
    code, got = code_and_field(lambda: stub.Observe(request_of(), timeout=10.0))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and got == field


def test_predict_with_learner_id_and_history_names_the_history(gateway) -> None:
    _, stub, _ = gateway
    request = pb.PredictRequest(model="kt", learner_id="x", candidates=[pb.Candidate(question_id=1)],
                                history=[pb.Interaction(question_id=1, correct=1)])
    assert code_and_field(lambda: stub.Predict(request, timeout=10.0)) == (grpc.StatusCode.INVALID_ARGUMENT, "history")
    batch = pb.PredictBatchRequest(model="kt", learners=[pb.LearnerRequest(learner_id="", candidates=[
        pb.Candidate(question_id=1)]), pb.LearnerRequest(learner_id="y" * 500, candidates=[pb.Candidate(question_id=1)])])
    assert code_and_field(lambda: stub.PredictBatch(batch, timeout=10.0)) == (
        grpc.StatusCode.INVALID_ARGUMENT, "learners[1].learner_id")


def test_forget_learner_leaves_nothing_and_the_raw_id_is_nowhere(gateway, kt_repository, caplog) -> None:
    gw, stub, url = gateway
    caplog.set_level(logging.DEBUG)
    observe(stub, RAW_ID, known_history(kt_repository, 8, seed=3), prefix=f"{RAW_ID}-event-")
    stub.Predict(pb.PredictRequest(model="kt", learner_id=RAW_ID, candidates=[pb.Candidate(question_id=1)]),
                 timeout=10.0)
    key = LearnerKeys(SECRET).learner(RAW_ID)
    store = gw.server.sessions.store
    assert key in gw.call(store.learner_keys())
    reply = stub.ForgetLearner(pb.ForgetLearnerRequest(learner_id=RAW_ID), timeout=10.0)
    assert reply.existed and reply.deleted == 8
    assert key not in gw.call(store.learner_keys())
    assert not stub.ForgetLearner(pb.ForgetLearnerRequest(learner_id=RAW_ID), timeout=10.0).existed
    metrics = httpx.get(f"http://127.0.0.1:{gw.http_port}/metrics", timeout=10.0, trust_env=False).text
    assert RAW_ID not in metrics and "learner-7f3a" not in metrics
    assert 'routerkt_events_total{result="stored"}' in metrics and "routerkt_store_up 1.0" in metrics
    assert RAW_ID not in caplog.text and "learner-7f3a" not in caplog.text
    assert all("learner-7f3a" not in k for k in gw.call(store.learner_keys()))
    if url.startswith("sqlite:///"):
        import sqlite3
        for path in (Path(url[len("sqlite:///"):]), store.served_path):   # events, and served predictions
            with sqlite3.connect(path) as conn:
                dump = "\n".join(conn.iterdump())
            assert "learner-7f3a" not in dump and key not in dump, path
    ready = httpx.get(f"http://127.0.0.1:{gw.http_port}/readyz", timeout=10.0, trust_env=False).json()
    assert ready["store"]["up"] is True
