"""History-once ranking through a real Triton and the gateway: the served graph is `rank`, learners
with different candidate counts are answered correctly in one PredictBatch, and Recommend orders
candidates by the documented policy (ties stable, exclude_seen, bad fields)."""
from __future__ import annotations

import grpc
import httpx
import numpy as np
import pytest

from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.core.catalog import ModelCatalog
from serving.metrics import Metrics
from serving.queries.recommend import DEFAULT_TARGET, order
from serving.server import ThreadedGateway
from serving.sessions.keys import LearnerKeys
from serving.sessions.factory import open_store
from serving.settings import Settings

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def gateway(kt_repository, triton, tmp_path_factory):
    settings = Settings(repository=kt_repository.path, triton_url=triton.grpc_url, grpc_port=0, http_port=0,
                        probe_interval_s=0.5, probe_timeout_s=10.0, grace_period_s=1.0)
    metrics, catalog = Metrics(), ModelCatalog(kt_repository.path)
    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('rank-store') / 's.sqlite3'}")
    gw = ThreadedGateway(settings, metrics, catalog=catalog, store=store,
                         keys=LearnerKeys(b"ranking-test-secret-32-bytes-ok!")).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}")
    stub = pb_grpc.KnowledgeTracingServiceStub(channel)
    for _ in range(240):
        if gw.server.backend.ready_versions("kt"):
            break
        import time
        time.sleep(0.25)
    try:
        yield gw, stub
    finally:
        channel.close()
        gw.stop(grace=1.0)


@pytest.fixture(scope="module")
def questions(kt_repository) -> list[int]:
    from routerkt.contract.repository_reader import read_vocab
    return sorted(read_vocab(kt_repository.path, "kt", 1).questions)


def history(questions, n: int) -> list[pb.Interaction]:
    return [pb.Interaction(question_id=questions[(7 * i) % len(questions)], correct=i % 2) for i in range(n)]


def test_the_repository_serves_the_rank_graph(gateway) -> None:
    gw, _ = gateway
    assert gw.server.catalog.get("kt", 1).graph.name == "rank"


def test_a_batch_of_learners_with_different_candidate_counts(gateway, questions) -> None:
    _, stub = gateway
    learners = [pb.LearnerRequest(history=history(questions, n), candidates=[
        pb.Candidate(question_id=questions[(3 * n + j) % len(questions)]) for j in range(c)])
        for n, c in ((0, 1), (4, 3), (25, 7), (9, 17), (30, 64))]
    together = stub.PredictBatch(pb.PredictBatchRequest(model="kt", learners=learners), timeout=20.0)
    assert [len(r.probabilities) for r in together.results] == [1, 3, 7, 17, 64]
    for learner, result in zip(learners, together.results):
        alone = stub.Predict(pb.PredictRequest(model="kt", history=learner.history, candidates=learner.candidates),
                             timeout=10.0)
        np.testing.assert_allclose(result.probabilities, alone.probabilities, atol=1e-6, rtol=0)
        one_by_one = [stub.Predict(pb.PredictRequest(model="kt", history=learner.history, candidates=[c]),
                                   timeout=10.0).probabilities[0] for c in learner.candidates[:5]]
        np.testing.assert_allclose(result.probabilities[:5], one_by_one, atol=1e-5, rtol=0)


def test_recommend_orders_by_distance_to_the_target_with_stable_ties(gateway, questions) -> None:
    _, stub = gateway
    cands = [pb.Candidate(question_id=q) for q in questions[:12]] + [pb.Candidate(question_id=questions[3])]
    hist = history(questions, 10)
    probs = np.asarray(stub.Predict(pb.PredictRequest(model="kt", history=hist, candidates=cands),
                                    timeout=10.0).probabilities)
    for target in (None, 0.5, 0.9):
        extra = {} if target is None else {"target_probability": target}
        reply = stub.Recommend(pb.RecommendRequest(model="kt", history=hist, candidates=cands, **extra), timeout=10.0)
        expected = order(probs, DEFAULT_TARGET if target is None else target)
        assert [r.question_id for r in reply.recommendations] == [cands[i].question_id for i in expected]
        np.testing.assert_allclose([r.probability for r in reply.recommendations], probs[expected], atol=1e-6)
        twin = [i for i, c in enumerate(cands) if c.question_id == questions[3]]
        assert [i for i in expected if i in twin] == twin            # equal probabilities keep request order
    top = stub.Recommend(pb.RecommendRequest(model="kt", history=hist, candidates=cands, top_k=3), timeout=10.0)
    assert len(top.recommendations) == 3


def test_recommend_excludes_seen_questions_from_the_history_or_the_store(gateway, questions) -> None:
    gw, stub = gateway
    hist = history(questions, 6)
    seen = {h.question_id for h in hist}
    cands = [pb.Candidate(question_id=q) for q in questions[:30]]
    reply = stub.Recommend(pb.RecommendRequest(model="kt", history=hist, candidates=cands, exclude_seen=True),
                           timeout=10.0)
    assert reply.excluded == len(seen & {c.question_id for c in cands}) > 0
    assert not seen & {r.question_id for r in reply.recommendations}
    stub.Observe(pb.ObserveRequest(learner_id="recommend-learner", events=[
        pb.Event(event_id=str(i), question_id=h.question_id, correct=h.correct) for i, h in enumerate(hist)]),
        timeout=10.0)
    by_id = stub.Recommend(pb.RecommendRequest(model="kt", learner_id="recommend-learner", candidates=cands,
                                               exclude_seen=True), timeout=10.0)
    assert [r.question_id for r in by_id.recommendations] == [r.question_id for r in reply.recommendations]
    np.testing.assert_allclose([r.probability for r in by_id.recommendations],
                               [r.probability for r in reply.recommendations], atol=1e-6)
    body = {"model": "kt", "learner_id": "recommend-learner", "exclude_seen": True, "top_k": 2,
            "candidates": [{"question_id": c.question_id} for c in cands]}
    http = httpx.post(f"http://127.0.0.1:{gw.http_port}/v1/recommend", json=body, timeout=10.0, trust_env=False)
    assert http.status_code == 200
    assert [r["question_id"] for r in http.json()["recommendations"]] == [
        r.question_id for r in reply.recommendations[:2]]


@pytest.mark.parametrize("extra, field", [({"target_probability": 0.0}, "target_probability"),
                                          ({"target_probability": 1.0}, "target_probability"),
                                          ({"target_probability": -3.0}, "target_probability"),
                                          ({"top_k": 0}, "top_k"), ({"top_k": -2}, "top_k")])
def test_recommend_rejects_bad_policy_fields(gateway, extra, field) -> None:
    _, stub = gateway
    with pytest.raises(grpc.RpcError) as info:
        stub.Recommend(pb.RecommendRequest(model="kt", candidates=[pb.Candidate(question_id=1)], **extra),
                       timeout=10.0)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert dict(info.value.trailing_metadata())["routerkt-field"] == field
