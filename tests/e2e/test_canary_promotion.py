"""The canary's sequential test through a real Triton and the real gateway (SQLite session store):
version 2 (trained on inverted answers, tests/e2e/test_outcomes_rollout.py) is the baseline and
version 1 the candidate, at weight 0.5. The learners answer the synthetic data's questions with
version 1's own probability (asked statelessly, so never joined), which makes version 1 the better
model by construction: log loss is a proper scoring rule, and version 2 loses the mean KL
divergence of its predictions from version 1's. They ask (PredictBatch, routed by the canary) and
answer (Observe) one step at a time until the gateway promotes version 1 (pinned, the file rewritten
with the test's note, routerkt_rollout_decisions_total, /v1/rollout and `routerkt rollout status`),
with 0 failed calls before, during and after."""
from __future__ import annotations

import json

import grpc
import numpy as np
import pytest

from routerkt.cli import main
from serving.api import knowledge_tracing_pb2 as pb
from tests.e2e.test_outcomes_rollout import Gateway, learner_sequences, triton2, two_versions, value  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROUNDS = 3            # the same questions again under new learner ids if needed
BATCH = 64


@pytest.fixture
def gateway(two_versions, triton2, tmp_path):  # noqa: F811
    gw = Gateway(two_versions, triton2, tmp_path)
    try:
        yield gw
    finally:
        gw.close()


def test_a_clearly_better_candidate_is_promoted_with_no_failed_call(gateway, kt_repository, capsys) -> None:
    gateway.set_policy({"kt": {"policy": "canary", "baseline": 2, "candidate": 1, "weight": 0.5,
                               "promotion": {"alpha": 0.05, "min_outcomes": 50}}})
    rng = np.random.default_rng(0)
    calls = failed = 0
    promoted_at = None
    questions = [[(q, s) for q, s, _ in sequence] for sequence in learner_sequences(kt_repository, 160, 60)]
    for round_ in range(ROUNDS):
        learners = [(f"promo-{round_}-{n}", sequence, []) for n, sequence in enumerate(questions)]
        for t in range(max(len(sequence) for sequence in questions)):
            step = [(learner, sequence[t], history) for learner, sequence, history in learners if t < len(sequence)]
            for start in range(0, len(step), BATCH):
                batch = step[start:start + BATCH]
                try:
                    calls += 2 + len(batch)
                    gateway.stub.PredictBatch(pb.PredictBatchRequest(model="kt", learners=[   # routed: the canary
                        pb.LearnerRequest(learner_id=learner, candidates=[pb.Candidate(question_id=q)])
                        for learner, (q, _), _ in batch]), timeout=30)
                    truth = gateway.stub.PredictBatch(pb.PredictBatchRequest(model="kt", version=1, learners=[
                        pb.LearnerRequest(history=history, candidates=[pb.Candidate(question_id=q)])
                        for _, (q, _), history in batch]), timeout=30)
                    for (learner, (q, s), history), result in zip(batch, truth.results):
                        c = int(rng.random() < result.probabilities[0])
                        gateway.stub.Observe(pb.ObserveRequest(learner_id=learner, events=[
                            pb.Event(event_id=f"e{t}", question_id=q, skill_id=s, correct=c)]), timeout=10)
                        history.append(pb.Interaction(question_id=q, skill_id=s, correct=c))
                except grpc.RpcError as exc:
                    failed += 1
                    print(f"failed call: {exc.code()} {exc.details()}")
            status = gateway.rollout()
            if status["models"]["kt"]["policy"] == "pinned":
                promoted_at = status["sequential_tests"].get("kt", status["models"]["kt"])
                break
        if promoted_at is not None:
            break
    assert promoted_at is not None, f"never promoted: {gateway.rollout()}"
    for n in range(20):                                           # after: every call answers, with version 1
        calls += 1
        response = gateway.stub.Predict(pb.PredictRequest(model="kt", learner_id=f"after-{n}",
                                                          candidates=[pb.Candidate(question_id=1)]), timeout=10)
        assert response.version == 1
    assert failed == 0, f"{failed} of {calls} calls failed"
    assert promoted_at["decision"] == "promote" and promoted_at["difference"]["upper"] < 0
    on_disk = json.loads(gateway.policy_file.read_text())["models"]["kt"]
    assert on_disk["policy"] == "pinned" and on_disk["version"] == 1
    assert "promoted by the sequential test" in on_disk["note"]
    samples = gateway.scrape()
    assert value(samples, "routerkt_rollout_decisions_total", model="kt", decision="promote") == 1
    assert value(samples, "routerkt_rollout_decisions_total", model="kt", decision="rollback") == 0
    assert value(samples, "routerkt_rollout_rollbacks_total", model="kt") == 0
    assert main(["rollout", "status", "--file", str(gateway.policy_file), "--gateway", gateway.http]) == 0
    out = capsys.readouterr().out
    assert "sequential test kt: candidate 1 - baseline 2" in out and "promoted" in out
    n = promoted_at["outcomes"]
    print(f"\npromoted after {n['candidate']} candidate / {n['baseline']} baseline outcomes "
          f"({calls} calls, {failed} failed): {promoted_at}")
