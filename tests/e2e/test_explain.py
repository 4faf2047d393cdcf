"""`explain` on Predict and Recommend end to end through a real Triton serving the tiny exported
routerkt-akt (version 1, with explain.onnx) beside a copy of it without the explain graph (version 2,
as exported before explanations): the served per-head attention equals the PyTorch knowledge
retriever's last layer within 1e-5 and each head's weights sum to at most 1, the head weights equal
the model's routing weights, a call without `explain` answers as before, version 2 answers
FAILED_PRECONDITION naming model and version, a bad top_k is INVALID_ARGUMENT naming
`explain.top_k`, and `routerkt predict --explain` prints the call's explanations."""
from __future__ import annotations

import json
import shutil

import grpc
import httpx
import numpy as np
import pytest

from routerkt.contract import signature
from serving.api import knowledge_tracing_pb2 as pb
from tests.e2e.conftest import gateway_over, triton_over

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.e2e

WINDOW = 20                     # TINY_OVERRIDES in tests/conftest.py


@pytest.fixture(scope="module")
def repository(kt_repository, tmp_path_factory):
    """kt version 1 as exported, and version 2: the same files without explain.onnx."""
    root = tmp_path_factory.mktemp("explain") / "models"
    shutil.copytree(kt_repository.path / kt_repository.name, root / "kt")
    shutil.copytree(root / "kt" / "1", root / "kt" / "2")
    (root / "kt" / "2" / signature.EXPLAIN_ONNX_FILE).unlink()
    return root


@pytest.fixture(scope="module")
def gateway(repository, tmp_path_factory):
    with triton_over(repository, tmp_path_factory.mktemp("triton")) as server, \
            gateway_over(repository, server.grpc_url, versions=(1, 2)) as served:
        yield served


@pytest.fixture(scope="module")
def history(checkpoint) -> list[tuple[int, int, int]]:
    """30 interactions (longer than the window) with their recorded skills."""
    vocab = checkpoint.vocab
    questions = sorted(vocab.questions)
    return [(questions[(3 * i) % len(questions)], vocab.question_skills[questions[(3 * i) % len(questions)]][0],
             int((i * 5) % 3 != 0)) for i in range(30)]


def interactions(history) -> list[pb.Interaction]:
    return [pb.Interaction(question_id=q, skill_id=s, correct=c) for q, s, c in history]


def torch_reference(checkpoint, history, candidates) -> tuple[np.ndarray, np.ndarray]:
    """(attention [N, heads, window - 1], head weights [N, heads]) from the PyTorch model, built here
    without serving/: the attention of each candidate's own window [history, candidate]."""
    from export.explain_export import window_attention
    from training.models.explain_forward import explain_rank
    vocab, used = checkpoint.vocab, history[-(WINDOW - 1):]
    hq = np.array([[vocab.questions[q] for q, _, _ in used]], dtype=np.int64)
    hs = np.array([[[vocab.skills[s]] for _, s, _ in used]], dtype=np.int64)
    hr = np.array([[c for _, _, c in used]], dtype=np.int64)
    cq = np.array([[vocab.questions[q] for q in candidates]], dtype=np.int64)
    cs = np.array([[[vocab.skills[vocab.question_skills[q][0]]] for q in candidates]], dtype=np.int64)
    model = checkpoint.model.eval()
    attention = window_attention(model, hq, hs, hr, cq, cs)[0]
    with torch.no_grad():
        weights = explain_rank(model, *(torch.from_numpy(a) for a in (hq, hs, hr, cq, cs))).head_weights
    return attention, weights[0].numpy()


def plain_and_explained(stub, history, candidates: list[int], top_k: int = WINDOW - 1):
    """(Predict, Predict with explain top_k; default: every interaction the model saw) of kt version 1."""
    request = pb.PredictRequest(model="kt", version=1, history=interactions(history),
                                candidates=[pb.Candidate(question_id=q) for q in candidates])
    plain = stub.Predict(request, timeout=20)
    request.explain.top_k = top_k
    return plain, stub.Predict(request, timeout=20)


def test_explanations_equal_the_pytorch_attention(gateway, checkpoint, history) -> None:
    _, stub = gateway
    candidates = sorted(checkpoint.vocab.questions)[:4]
    plain, answer = plain_and_explained(stub, history, candidates)
    assert not plain.explanations and len(answer.explanations) == len(candidates)
    assert answer.version == 1 and answer.history_used == WINDOW - 1
    np.testing.assert_allclose(answer.probabilities, plain.probabilities, atol=1e-5, rtol=0)
    attention, weights = torch_reference(checkpoint, history, candidates)
    first = len(history) - (WINDOW - 1)
    for j, explanation in enumerate(answer.explanations):
        np.testing.assert_allclose(explanation.head_weights, weights[j], atol=1e-5, rtol=0)
        served = np.zeros_like(attention[j])                      # [heads, window - 1]
        assert sorted(a.position for a in explanation.attended) == list(range(first, len(history)))
        for a in explanation.attended:
            q, s, c = history[a.position]
            assert (a.question_id, list(a.skill_ids), a.correct) == (q, [s], bool(c))
            served[:, a.position - first] = a.head_attention
            w = np.asarray(weights[j])
            assert abs(a.weight - float(w @ np.asarray(a.head_attention) / w.sum())) <= 1e-5
        np.testing.assert_allclose(served, attention[j], atol=1e-5, rtol=0)
        assert (served.sum(axis=1) <= 1 + 1e-5).all()                # each head's weights sum to at most 1
        ranked = [a.weight for a in explanation.attended]
        assert ranked == sorted(ranked, reverse=True)


def test_default_top_k_recommend_and_http(gateway, checkpoint, history) -> None:
    gw, stub = gateway
    candidates = sorted(checkpoint.vocab.questions)[:5]
    answer = stub.Recommend(pb.RecommendRequest(model="kt", version=1, history=interactions(history),
                                                candidates=[pb.Candidate(question_id=q) for q in candidates],
                                                top_k=2, explain=pb.ExplainOptions()), timeout=20)
    assert len(answer.recommendations) == 2
    assert all(len(r.explanation.attended) == 5 for r in answer.recommendations)
    body = {"model": "kt", "version": 1, "candidates": [{"question_id": q} for q in candidates[:2]],
            "history": [{"question_id": q, "skill_id": s, "correct": c} for q, s, c in history], "explain": {"top_k": 3}}
    got = httpx.post(f"http://127.0.0.1:{gw.http_port}/v1/predict", json=body, timeout=20).json()
    assert [len(e["attended"]) for e in got["explanations"]] == [3, 3]
    plain = httpx.post(f"http://127.0.0.1:{gw.http_port}/v1/predict", json={**body, "explain": None}, timeout=20).json()
    assert plain["explanations"] == []
    np.testing.assert_allclose(got["probabilities"], plain["probabilities"], atol=1e-5, rtol=0)


def test_a_version_without_the_explain_graph_is_a_failed_precondition(gateway, history) -> None:
    _, stub = gateway
    request = pb.PredictRequest(model="kt", version=2, history=interactions(history),
                                candidates=[pb.Candidate(question_id=history[0][0])])
    assert len(stub.Predict(request, timeout=20).probabilities) == 1      # it still predicts
    request.explain.top_k = 3
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(request, timeout=20)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "kt" in info.value.details() and "version 2" in info.value.details()


@pytest.mark.parametrize("top_k", [WINDOW, -1])
def test_top_k_out_of_range_names_the_field(gateway, history, top_k) -> None:
    _, stub = gateway
    request = pb.PredictRequest(model="kt", version=1, history=interactions(history),
                                candidates=[pb.Candidate(question_id=history[0][0])], explain=pb.ExplainOptions(top_k=top_k))
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(request, timeout=20)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "explain.top_k" in info.value.details()


def test_routerkt_predict_explain_prints_the_gateways_explanations(gateway, checkpoint, history, capsys) -> None:
    """`routerkt predict --explain 3` through the gateway and Triton: the JSON form carries the call's
    explanations, the text form one head-weights line and 3 attended lines per candidate."""
    from routerkt.cli import main
    gw, stub = gateway
    candidates = sorted(checkpoint.vocab.questions)[:2]
    argv = ["predict", "--target", f"127.0.0.1:{gw.grpc_port}", "--model", "kt", "--version", "1",
            "--history", ",".join(f"{q}:{s}:{c}" for q, s, c in history),
            "--candidates", ",".join(str(q) for q in candidates), "--explain", "3", "--timeout", "20"]
    assert main(argv + ["--json"]) == 0
    printed = json.loads(capsys.readouterr().out)["explanations"]
    _, answer = plain_and_explained(stub, history, candidates, top_k=3)
    assert [[(a["position"], a["question_id"], a["skill_ids"], a["correct"]) for a in e["attended"]] for e in printed] \
        == [[(a.position, a.question_id, list(a.skill_ids), a.correct) for a in e.attended]
            for e in answer.explanations]
    for got, expected in zip(printed, answer.explanations):
        np.testing.assert_allclose(got["head_weights"], expected.head_weights, atol=1e-6, rtol=0)
        np.testing.assert_allclose([a["weight"] for a in got["attended"]], [a.weight for a in expected.attended],
                                   atol=1e-6, rtol=0)
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("  head weights: ") for line in lines) == 2
    assert sum(line.startswith("  attended position ") for line in lines) == 6
