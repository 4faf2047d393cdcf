"""Skill sets end to end, through a real Triton serving the tiny exported model and a real session
store (SQLite): a Predict with two-skill interactions and a two-skill candidate equals the PyTorch
model fed the same sets (built here independently of serving/encoder/window.py), the set reaches the model
(the answer differs from the first skill alone), the HTTP mirror answers alike, and an Observe of
two-skill events (one with a skill no served version knows) followed by a Predict by learner_id
equals the explicit history."""
from __future__ import annotations

import httpx
import numpy as np
import pytest

from serving.api import knowledge_tracing_pb2 as pb

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.e2e

WINDOW = 20                     # TINY_OVERRIDES in tests/conftest.py


def model_set(vocab, question: int, skills) -> list[int]:
    """The model ids of an interaction's skill set: given (an id or a list), else the question's."""
    raw = list(vocab.question_skills.get(question, (-1,))) if skills is None else \
        [skills] if isinstance(skills, int) else list(skills)
    return [vocab.skills.get(s, 1) for s in raw]


def torch_probabilities(checkpoint, history, candidates) -> np.ndarray:
    """The reference: left-padded rows [C, WINDOW] and skill sets [C, WINDOW, K] (PAD_ID 0 in unused
    slots), straight into the PyTorch model."""
    vocab = checkpoint.vocab
    used = history[-(WINDOW - 1):]
    pad = WINDOW - 1 - len(used)
    sets = [model_set(vocab, q, s) for q, s, _ in used]
    width = max(len(x) for x in sets + [model_set(vocab, q, s) for q, s in candidates])
    rows_q, rows_s, rows_r = [], [], []
    for question, skills in candidates:
        rows_q.append([0] * pad + [vocab.questions.get(q, 1) for q, _, _ in used] + [vocab.questions.get(question, 1)])
        row = [[]] * pad + sets + [model_set(vocab, question, skills)]
        rows_s.append([x + [0] * (width - len(x)) for x in row])
        rows_r.append([-1] * pad + [c for _, _, c in used] + [0])
    tensors = [torch.tensor(rows, dtype=torch.int64) for rows in (rows_q, rows_s, rows_r)]
    with torch.no_grad():
        return torch.sigmoid(checkpoint.model(*tensors).logits)[:, -1].numpy()


def fields(skills) -> dict:
    if skills is None:
        return {}
    return {"skill_ids": list(skills)} if isinstance(skills, (list, tuple)) else {"skill_id": skills}


def request(history, candidates, learner_id: str = "") -> pb.PredictRequest:
    return pb.PredictRequest(
        model="kt", learner_id=learner_id,
        history=[pb.Interaction(question_id=q, correct=c, **fields(s)) for q, s, c in history],
        candidates=[pb.Candidate(question_id=q, **fields(s)) for q, s in candidates])


@pytest.fixture(scope="module")
def sample(checkpoint):
    """A history mixing two-skill sets, single skills and looked-up ones; candidates with a set."""
    vocab = checkpoint.vocab
    questions, skills = sorted(vocab.questions), sorted(vocab.skills)
    a, b, c = skills[0], skills[1], skills[-1]
    history = [(questions[i], [a, b] if i % 3 == 0 else (c if i % 3 == 1 else None), i % 2) for i in range(12)]
    candidates = [(questions[3], [a, c]), (questions[4], None), (questions[5], b), (questions[6], [b, a, c])]
    return history, candidates


def test_a_two_skill_candidate_answers_through_triton_as_pytorch(stored_gateway, checkpoint, sample) -> None:
    _, stub = stored_gateway
    history, candidates = sample
    response = stub.Predict(request(history, candidates), timeout=10.0)
    expected = torch_probabilities(checkpoint, history, candidates)
    np.testing.assert_allclose(np.asarray(response.probabilities), expected, atol=1e-5, rtol=0)
    first_only = torch_probabilities(checkpoint, [(q, s[0] if isinstance(s, list) else s, r) for q, s, r in history],
                                     [(q, s[0] if isinstance(s, list) else s) for q, s in candidates])
    assert np.abs(np.asarray(response.probabilities) - first_only).max() > 1e-4    # the sets reached the model


def test_the_http_mirror_and_ragged_columns_answer_alike(stored_gateway, sample) -> None:
    gw, stub = stored_gateway
    history, candidates = sample
    by_messages = np.asarray(stub.Predict(request(history, candidates), timeout=10.0).probabilities)
    lengths = [len(s) if isinstance(s, list) else (1 if s is not None else 0) for _, s, _ in history]
    values = [x for _, s, _ in history for x in (s if isinstance(s, list) else [] if s is None else [s])]
    columns = pb.HistoryColumns(question_ids=[q for q, _, _ in history], correct=[r for _, _, r in history],
                                skill_lengths=lengths, skill_values=values)
    by_columns = stub.Predict(pb.PredictRequest(model="kt", history_columns=columns,
                                                candidates=request([], candidates).candidates), timeout=10.0)
    np.testing.assert_allclose(np.asarray(by_columns.probabilities), by_messages, atol=1e-6, rtol=0)
    body = {"model": "kt", "history": [{"question_id": q, "correct": r, **fields(s)} for q, s, r in history],
            "candidates": [{"question_id": q, **fields(s)} for q, s in candidates]}
    reply = httpx.post(f"http://127.0.0.1:{gw.http_port}/v1/predict", json=body, timeout=10.0)
    assert reply.status_code == 200, reply.text
    np.testing.assert_allclose(np.asarray(reply.json()["probabilities"]), by_messages, atol=1e-6, rtol=0)
    bad = {**body, "candidates": [{"question_id": 1, "skill_id": 3, "skill_ids": [3]}]}
    reply = httpx.post(f"http://127.0.0.1:{gw.http_port}/v1/predict", json=bad, timeout=10.0)
    assert reply.status_code == 400 and reply.json()["error"]["field"] == "candidates[0].skill_ids"


def test_observed_skill_sets_predict_as_the_explicit_history(stored_gateway, sample) -> None:
    _, stub = stored_gateway
    history, candidates = sample
    learner = "skill-sets-learner"
    events = [pb.Event(event_id=f"e{i}", question_id=q, correct=c, **fields(s)) for i, (q, s, c) in enumerate(history)]
    stored = stub.Observe(pb.ObserveRequest(learner_id=learner, events=events), timeout=10.0)
    assert stored.stored == len(history)
    by_id = stub.Predict(request([], candidates, learner_id=learner), timeout=10.0)
    explicit = stub.Predict(request(history, candidates), timeout=10.0)
    assert by_id.history_used == explicit.history_used == len(history)
    np.testing.assert_allclose(np.asarray(by_id.probabilities), np.asarray(explicit.probabilities), atol=1e-6, rtol=0)
    # a set with a skill no served version knows (added to the platform since): stored, then the unknown id
    added = (history[0][0], [history[0][1][0], 10**9], 1)
    assert stub.Observe(pb.ObserveRequest(learner_id=learner, events=[
        pb.Event(event_id="new-skill", question_id=added[0], correct=added[2], **fields(added[1]))]),
        timeout=10.0).stored == 1
    by_id = stub.Predict(request([], candidates, learner_id=learner), timeout=10.0)
    explicit = stub.Predict(request(history + [added], candidates), timeout=10.0)
    assert by_id.history_used == explicit.history_used == len(history) + 1
    np.testing.assert_allclose(np.asarray(by_id.probabilities), np.asarray(explicit.probabilities), atol=1e-6, rtol=0)
