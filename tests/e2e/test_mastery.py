"""Mastery end to end through a real Triton serving the tiny exported routerkt-akt and a real session
store: P(correct) per skill equals the PyTorch model's window [history, (UNK question, {s})] within
1e-5, is invariant to the order of the requested skills, reads a stored learner like the explicit
history, tracks nothing, answers over HTTP alike, and names the field of a bad skill."""
from __future__ import annotations

import grpc
import httpx
import numpy as np
import pytest

from routerkt.contract.signature import UNK_ID
from serving.api import knowledge_tracing_pb2 as pb

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.e2e

WINDOW = 20                     # TINY_OVERRIDES in tests/conftest.py


@pytest.fixture(scope="module")
def history(checkpoint) -> list[tuple[int, int, int]]:
    """30 interactions (longer than the window) with their recorded skills."""
    vocab = checkpoint.vocab
    questions = sorted(vocab.questions)
    return [(questions[(5 * i) % len(questions)], vocab.question_skills[questions[(5 * i) % len(questions)]][0],
             (i * 7) % 3 != 0) for i in range(30)]


def torch_mastery(checkpoint, history, skills) -> np.ndarray:
    """The reference, built here without serving/: one left-padded window per skill, the last slot
    the unknown question with the skill set {s}."""
    vocab, used = checkpoint.vocab, history[-(WINDOW - 1):]
    pad = WINDOW - 1 - len(used)
    q = [[0] * pad + [vocab.questions[x] for x, _, _ in used] + [UNK_ID] for _ in skills]
    s = [[[0]] * pad + [[vocab.skills[k]] for _, k, _ in used] + [[vocab.skills[k]]] for k in skills]
    r = [[-1] * pad + [int(c) for _, _, c in used] + [0] for _ in skills]
    with torch.no_grad():
        logits = checkpoint.model(*(torch.tensor(a, dtype=torch.int64) for a in (q, s, r))).logits
    return torch.sigmoid(logits[:, -1]).numpy()


def interactions(history) -> list[pb.Interaction]:
    return [pb.Interaction(question_id=q, skill_id=s, correct=int(c)) for q, s, c in history]


def test_every_skill_equals_pytorch(stored_gateway, checkpoint, history) -> None:
    _, stub = stored_gateway
    answer = stub.Mastery(pb.MasteryRequest(model="kt", history=interactions(history)), timeout=20)
    skills = sorted(checkpoint.vocab.skills)
    assert [s.skill_id for s in answer.skills] == skills
    assert answer.history_used == WINDOW - 1 and answer.version == 1
    np.testing.assert_allclose([s.probability for s in answer.skills], torch_mastery(checkpoint, history, skills),
                               atol=1e-5, rtol=0)


def test_order_of_requested_skills_does_not_matter(stored_gateway, checkpoint, history) -> None:
    _, stub = stored_gateway
    skills = sorted(checkpoint.vocab.skills)
    picked = [skills[3], skills[0], skills[-1], skills[5]]
    first = stub.Mastery(pb.MasteryRequest(model="kt", history=interactions(history), skill_ids=picked), timeout=20)
    again = stub.Mastery(pb.MasteryRequest(model="kt", history=interactions(history), skill_ids=picked[::-1]),
                         timeout=20)
    assert [s.skill_id for s in first.skills] == picked
    one = {s.skill_id: s.probability for s in first.skills}
    other = {s.skill_id: s.probability for s in again.skills}
    for skill in picked:
        assert abs(one[skill] - other[skill]) <= 1e-6
    np.testing.assert_allclose([one[s] for s in picked], torch_mastery(checkpoint, history, picked), atol=1e-5, rtol=0)


def test_a_stored_learner_reads_like_the_explicit_history_and_is_not_tracked(stored_gateway, history) -> None:
    gw, stub = stored_gateway
    events = [pb.Event(event_id=f"m{i}", question_id=q, skill_id=s, correct=int(c))
              for i, (q, s, c) in enumerate(history)]
    stub.Observe(pb.ObserveRequest(learner_id="mastery-learner", events=events), timeout=10)
    counted = lambda: gw.server.metrics.registry.get_sample_value(  # noqa: E731
        "routerkt_predictions_total", {"model": "kt", "version": "1"}) or 0.0
    before = counted()
    stored = stub.Mastery(pb.MasteryRequest(model="kt", learner_id="mastery-learner"), timeout=20)
    explicit = stub.Mastery(pb.MasteryRequest(model="kt", history=interactions(history)), timeout=20)
    assert [s.skill_id for s in stored.skills] == [s.skill_id for s in explicit.skills]
    np.testing.assert_allclose([s.probability for s in stored.skills], [s.probability for s in explicit.skills],
                               atol=1e-6, rtol=0)
    assert counted() == before                      # no prediction recorded: nothing for the outcome tracker
    assert "prediction_id" not in pb.MasteryResponse.DESCRIPTOR.fields_by_name


def test_http_mirror_and_bad_skills(stored_gateway, checkpoint, history) -> None:
    gw, stub = stored_gateway
    skills = sorted(checkpoint.vocab.skills)
    body = {"model": "kt", "history": [{"question_id": q, "skill_id": s, "correct": int(c)} for q, s, c in history],
            "skill_ids": skills[:3]}
    answer = httpx.post(f"http://127.0.0.1:{gw.http_port}/v1/mastery", json=body, timeout=20).json()
    grpc_answer = stub.Mastery(pb.MasteryRequest(model="kt", history=interactions(history), skill_ids=skills[:3]),
                               timeout=20)
    assert [s["skill_id"] for s in answer["skills"]] == skills[:3]
    np.testing.assert_allclose([s["probability"] for s in answer["skills"]],
                               [s.probability for s in grpc_answer.skills], atol=1e-6, rtol=0)
    for bad, field in (([skills[0], 10_000_000], "skill_ids[1]"), ([skills[0], skills[1], skills[0]], "skill_ids[2]"),
                       ([-4], "skill_ids[0]")):
        with pytest.raises(grpc.RpcError) as err:
            stub.Mastery(pb.MasteryRequest(model="kt", history=interactions(history), skill_ids=bad), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in err.value.details()


def test_the_unknown_question_keeps_its_zero_difficulty(checkpoint) -> None:
    """The definition's premise (serving/queries/mastery.py): no training interaction maps to UNK_ID, so the
    Rasch difficulty row of the unknown question stays at its zero init after training."""
    weights = checkpoint.model.difficulty.weight.detach()
    assert float(weights[UNK_ID].abs().max()) == 0.0
    assert float(weights[2:].abs().max()) > 0.0                      # the real questions' rows did move
