"""The gateway with injected parts: the in-process onnxruntime backend behind real gRPC and HTTP on
loopback, over the tiny exported model. Tests the code around the backend (pipeline, adapters,
create_server's seams); the e2e tests cover the same calls through a real Triton."""
from __future__ import annotations

import grpc
import httpx
import numpy as np
import pytest

from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.backends.onnxruntime import OnnxRuntimeBackend
from serving.metrics import Metrics
from serving.server import ThreadedGateway
from serving.settings import Settings

pytestmark = pytest.mark.integration

torch = pytest.importorskip("torch")
WINDOW = 20                     # TINY_OVERRIDES in tests/conftest.py


class CountingSink:
    """A prediction sink that keeps what it saw (the seam outcome tracking will use)."""

    def __init__(self) -> None:
        self.records = []

    def on_prediction(self, prediction) -> None:
        self.records.append(prediction)


@pytest.fixture(scope="module")
def checkpoint(kt_repository):
    from training.checkpoint import load_checkpoint
    from training.training_run import best_fold_dir
    return load_checkpoint(best_fold_dir(kt_repository.run))


@pytest.fixture(scope="module")
def gateway(kt_repository):
    settings = Settings(repository=kt_repository.path, grpc_port=0, http_port=0, probe_interval_s=0.5,
                        grace_period_s=1.0)
    sink = CountingSink()
    gw = ThreadedGateway(settings, Metrics(), backend=OnnxRuntimeBackend(settings), sink=sink).start()
    try:
        yield gw, sink
    finally:
        gw.stop(grace=1.0)


def torch_probs(checkpoint, history, candidates) -> np.ndarray:
    vocab = checkpoint.vocab
    used = history[-(WINDOW - 1):]
    pad = WINDOW - 1 - len(used)
    rows = [([0] * pad + [vocab.questions[q] for q, _, _ in used] + [vocab.questions[c]],
             [0] * pad + [vocab.skills[s] for _, s, _ in used] + [vocab.skills[vocab.question_skill[c]]],
             [-1] * pad + [r for _, _, r in used] + [0]) for c in candidates]
    tensors = [torch.tensor([row[k] for row in rows], dtype=torch.int64) for k in range(3)]
    with torch.no_grad():
        return torch.sigmoid(checkpoint.model(*tensors).logits)[:, -1].numpy()


def test_grpc_and_http_answer_like_pytorch_through_the_injected_backend(gateway, checkpoint) -> None:
    gw, sink = gateway
    vocab = checkpoint.vocab
    questions = [q for q in sorted(vocab.questions) if vocab.question_skill.get(q, -1) in vocab.skills]
    history = [(q, vocab.question_skill[q], i % 2) for i, q in enumerate(questions[:30])]
    candidates = questions[30:33]
    expected = torch_probs(checkpoint, history, candidates)
    request = pb.PredictRequest(model="kt", history=[pb.Interaction(question_id=q, skill_id=s, correct=c)
                                                     for q, s, c in history],
                                candidates=[pb.Candidate(question_id=q) for q in candidates])
    with grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}") as channel:
        response = pb_grpc.KnowledgeTracingServiceStub(channel).Predict(request, timeout=10.0)
    assert response.model == "kt" and response.history_used == WINDOW - 1
    np.testing.assert_allclose(response.probabilities, expected, atol=1e-5, rtol=0)

    body = {"model": "kt", "history": [{"question_id": q, "skill_id": s, "correct": c} for q, s, c in history],
            "candidates": [{"question_id": q} for q in candidates]}
    answer = httpx.post(f"http://127.0.0.1:{gw.http_port}/v1/predict", json=body, timeout=10.0, trust_env=False)
    assert answer.status_code == 200
    np.testing.assert_allclose(answer.json()["probabilities"], expected, atol=1e-5, rtol=0)
    assert len(sink.records) == 2 and sink.records[-1].result.model == "kt"
    ready = httpx.get(f"http://127.0.0.1:{gw.http_port}/readyz", timeout=10.0, trust_env=False).json()
    assert ready["ready"] and ready["backend"] == "onnxruntime" and ready["models"] == {"kt": [1]}


def test_an_unknown_model_is_not_found_and_nothing_reaches_the_sink(gateway) -> None:
    gw, sink = gateway
    before = len(sink.records)
    with grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}") as channel:
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.KnowledgeTracingServiceStub(channel).Predict(
                pb.PredictRequest(model="x" * 5000, candidates=[pb.Candidate(question_id=1)]), timeout=10.0)
    assert info.value.code() is grpc.StatusCode.NOT_FOUND
    assert len(info.value.details()) < 200                 # a long name is not echoed whole
    assert len(sink.records) == before


def test_a_learners_candidates_split_over_several_inferences_answer_the_same(kt_repository, checkpoint) -> None:
    """rank_candidates_per_infer 2: 7 candidates go out as 4 rank inferences of one history; the
    answers are PyTorch's, in the candidates' order, for one learner and within a batch."""
    settings = Settings(repository=kt_repository.path, grpc_port=0, http_port=None, probe_interval_s=0.5,
                        grace_period_s=1.0, rank_candidates_per_infer=2)
    backend = OnnxRuntimeBackend(settings)
    calls = []
    infer = backend.infer

    async def counted(model, feeds, timeout_s):
        calls.append(feeds["candidate_questions"].shape)
        return await infer(model, feeds, timeout_s)
    backend.infer = counted
    gw = ThreadedGateway(settings, Metrics(), backend=backend).start()
    try:
        vocab = checkpoint.vocab
        questions = [q for q in sorted(vocab.questions) if vocab.question_skill.get(q, -1) in vocab.skills]
        history = [(q, vocab.question_skill[q], i % 2) for i, q in enumerate(questions[:12])]
        candidates = questions[12:19]
        expected = torch_probs(checkpoint, history, candidates)
        learner = pb.LearnerRequest(history=[pb.Interaction(question_id=q, skill_id=s, correct=c) for q, s, c in history],
                                    candidates=[pb.Candidate(question_id=q) for q in candidates])
        with grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}") as channel:
            stub = pb_grpc.KnowledgeTracingServiceStub(channel)
            single = stub.Predict(pb.PredictRequest(model="kt", history=learner.history, candidates=learner.candidates),
                                  timeout=10.0)
            assert len(calls) == 4 and all(shape[0] == 1 for shape in calls)
            batch = stub.PredictBatch(pb.PredictBatchRequest(model="kt", learners=[learner, learner]), timeout=10.0)
        np.testing.assert_allclose(single.probabilities, expected, atol=1e-5, rtol=0)
        for result in batch.results:
            np.testing.assert_allclose(result.probabilities, expected, atol=1e-5, rtol=0)
    finally:
        gw.stop(grace=1.0)


def test_history_columns_answer_like_pytorch_and_bad_columns_name_the_field(gateway, checkpoint) -> None:
    """HistoryColumns over real gRPC: Predict and PredictBatch answer as PyTorch does for the same
    history; columns of different lengths get INVALID_ARGUMENT with the column in routerkt-field."""
    gw, _ = gateway
    vocab = checkpoint.vocab
    questions = [q for q in sorted(vocab.questions) if vocab.question_skill.get(q, -1) in vocab.skills]
    history = [(q, vocab.question_skill[q], (i * 7) % 3 % 2) for i, q in enumerate(questions[:25])]
    candidates = questions[25:28]
    expected = torch_probs(checkpoint, history, candidates)
    columns = pb.HistoryColumns(question_ids=[q for q, _, _ in history], skill_ids=[s for _, s, _ in history],
                                correct=[c for _, _, c in history])
    asked = [pb.Candidate(question_id=q) for q in candidates]
    with grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}") as channel:
        stub = pb_grpc.KnowledgeTracingServiceStub(channel)
        single = stub.Predict(pb.PredictRequest(model="kt", history_columns=columns, candidates=asked), timeout=10.0)
        batch = stub.PredictBatch(pb.PredictBatchRequest(model="kt", learners=[
            pb.LearnerRequest(history_columns=columns, candidates=asked)] * 2), timeout=10.0)
        bad = pb.HistoryColumns(question_ids=[questions[0]] * 3, correct=[1, 0])
        with pytest.raises(grpc.RpcError) as caught:
            stub.PredictBatch(pb.PredictBatchRequest(model="kt", learners=[
                pb.LearnerRequest(history_columns=columns, candidates=asked),
                pb.LearnerRequest(history_columns=bad, candidates=asked)]), timeout=10.0)
    np.testing.assert_allclose(single.probabilities, expected, atol=1e-5, rtol=0)
    assert single.history_used == WINDOW - 1
    for result in batch.results:
        np.testing.assert_allclose(result.probabilities, expected, atol=1e-5, rtol=0)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(caught.value.trailing_metadata())["routerkt-field"] == "learners[1].history_columns.correct"

    url = f"http://127.0.0.1:{gw.http_port}/v1"            # the HTTP mirror takes the same columns
    json_columns = {"question_ids": list(columns.question_ids), "skill_ids": list(columns.skill_ids),
                    "correct": list(columns.correct)}
    body = {"model": "kt", "history_columns": json_columns, "candidates": [{"question_id": q} for q in candidates]}
    answer = httpx.post(f"{url}/predict", json=body, timeout=10.0, trust_env=False)
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose(answer.json()["probabilities"], expected, atol=1e-5, rtol=0)
    body["learners"] = [{"candidates": body["candidates"], "history_columns": {**json_columns, "skill_ids": [3]}}]
    refused = httpx.post(f"{url}/predict_batch", json=body, timeout=10.0, trust_env=False)
    assert refused.status_code == 400 and refused.json()["error"]["field"] == "learners[0].history_columns.skill_ids"

