"""Outcome tracking and rollout with a real Triton serving two versions of one model, the real
gateway and a real SQLite session store. Version 1 is the tiny model of tests/conftest.py;
version 2 is the same recipe trained on INVERTED answers (a deliberately bad model).

- The recorded outcome counters (scraped from /metrics) equal an offline computation over the
  (served probability, answer) pairs: by learner id through Observe, and stateless through ReportOutcome.
- Canary 0.2 over 2,000 learners: B's share within 0.03 and every learner always gets one version.
- Shadow never changes a response; its outcomes are tracked.
- The bad version as a canary is rolled back by the guardrail after M outcomes.
- A malformed policy file keeps the previous policy and says why.
(A version published under load fails no call: tests/e2e/test_version_publish.py.)"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.core.catalog import ModelCatalog
from serving.metrics import Metrics
from serving.server import ThreadedGateway
from serving.sessions.keys import LearnerKeys
from serving.sessions.factory import open_store
from serving.settings import Settings
from tests.e2e.conftest import triton_over
from tests.conftest import train_tiny

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

KEYS = LearnerKeys(b"outcomes-e2e-secret-32-bytes-ok!")


@pytest.fixture(scope="module")
def two_versions(kt_repository, tmp_path_factory) -> Path:
    """A repository whose model `kt` has version 1 (good) and version 2 (trained on inverted answers)."""
    from export.exporter import export_run
    folder = tmp_path_factory.mktemp("two_versions")
    repo = folder / "repo"
    shutil.copytree(kt_repository.path, repo)
    data = pd.read_csv(kt_repository.data)
    data["correct"] = 1 - data["correct"]
    inverted = folder / "inverted.csv"
    data.to_csv(inverted, index=False)
    run = train_tiny(inverted, folder / "inverted-run")
    export_run(run, repo, name="kt", version=2, log=lambda *_: None)
    return repo


@pytest.fixture(scope="module")
def triton2(two_versions, tmp_path_factory):
    with triton_over(two_versions, tmp_path_factory.mktemp("triton2")) as server:
        yield server


class Gateway:
    def __init__(self, repo: Path, triton, folder: Path) -> None:
        self.policy_file = folder / "rollout.json"
        settings = Settings(repository=repo, triton_url=triton.grpc_url, grpc_port=0, http_port=0,
                            probe_interval_s=0.5, probe_timeout_s=10.0, grace_period_s=1.0,
                            rollout_policy=self.policy_file, rollout_poll_s=0.1, outcome_flush_s=0.02)
        self.metrics, catalog = Metrics(), ModelCatalog(repo)
        self.gw = ThreadedGateway(settings, self.metrics, catalog=catalog,
                                  store=open_store(f"sqlite:///{folder / 's.sqlite3'}"), keys=KEYS).start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.gw.grpc_port}")
        self.stub = pb_grpc.KnowledgeTracingServiceStub(self.channel)
        self.http = f"http://127.0.0.1:{self.gw.http_port}"
        deadline = time.monotonic() + 90
        while self.gw.server.backend.ready_versions("kt") != frozenset({1, 2}):
            assert time.monotonic() < deadline, "versions 1 and 2 never became ready"
            time.sleep(0.2)

    def set_policy(self, models: dict) -> None:
        self.policy_file.write_text(json.dumps({"format": 1, "models": models}))
        deadline = time.monotonic() + 10
        while self.rollout()["models"] != {k: self._normal(v) for k, v in models.items()}:
            assert time.monotonic() < deadline, f"policy never applied: {self.rollout()}"
            time.sleep(0.05)

    @staticmethod
    def _normal(value: dict) -> dict:
        from serving.rollout.policy_file import parse_model
        return parse_model("kt", value).to_json()

    def rollout(self) -> dict:
        status = httpx.get(self.http + "/v1/rollout", timeout=5).json()
        status["models"] = {k: {f: v for f, v in e.items() if f not in ("since_canary_began", "routing")}
                            for k, e in status["models"].items()}
        return status

    def scrape(self) -> dict[tuple[str, tuple], float]:
        text = httpx.get(self.http + "/metrics", timeout=5).text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def close(self) -> None:
        self.channel.close()
        self.gw.stop(grace=1.0)


@pytest.fixture
def gateway(two_versions, triton2, tmp_path):
    gw = Gateway(two_versions, triton2, tmp_path)
    try:
        yield gw
    finally:
        gw.close()


def learner_sequences(kt_repository, n: int, steps: int) -> list[list[tuple[int, int, int]]]:
    data = pd.read_csv(kt_repository.data)
    out = []
    for _, rows in list(data.groupby("user_id"))[:n]:
        out.append([(int(r.question_id), int(r.skill_id), int(r.correct)) for r in rows.itertuples()][:steps])
    return out


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_recorded_outcomes_equal_the_offline_computation(gateway, kt_repository) -> None:
    gateway.set_policy({"kt": {"policy": "pinned", "version": 1}})
    pairs: list[tuple[float, int]] = []
    for n, sequence in enumerate(learner_sequences(kt_repository, 20, 8)):
        learner = f"learner-{n}"
        for t, (q, s, c) in enumerate(sequence):
            others = [x for x in (q + 1, q + 2) if x != q]
            response = gateway.stub.Predict(pb.PredictRequest(
                model="kt", learner_id=learner, candidates=[pb.Candidate(question_id=x) for x in [q] + others]),
                timeout=10)
            assert response.prediction_id == ""                   # answers of named learners come by Observe
            pairs.append((response.probabilities[0], c))
            gateway.stub.Observe(pb.ObserveRequest(learner_id=learner, events=[
                pb.Event(event_id=f"e{t}", question_id=q, skill_id=s, correct=c)]), timeout=10)
        again = gateway.stub.Observe(pb.ObserveRequest(learner_id=learner, events=[
            pb.Event(event_id="e0", question_id=sequence[0][0], skill_id=sequence[0][1], correct=sequence[0][2])]),
            timeout=10)
        assert again.duplicates == 1                               # a retried Observe counts nothing
    history = [pb.Interaction(question_id=q, skill_id=s, correct=c) for q, s, c in learner_sequences(kt_repository, 1, 6)[0]]
    for q, c in ((3, 1), (4, 0), (5, 1)):                           # stateless: ReportOutcome by prediction_id
        response = gateway.stub.Predict(pb.PredictRequest(model="kt", history=history,
                                                          candidates=[pb.Candidate(question_id=q)]), timeout=10)
        assert len(response.prediction_id) == 32
        assert gateway.stub.ReportOutcome(pb.ReportOutcomeRequest(prediction_id=response.prediction_id,
                                                                  question_id=q, correct=c), timeout=10).recorded == 1
        assert gateway.stub.ReportOutcome(pb.ReportOutcomeRequest(prediction_id=response.prediction_id,
                                                                  question_id=q, correct=c), timeout=10).recorded == 0
        pairs.append((response.probabilities[0], c))
    p = np.array([x for x, _ in pairs], dtype=np.float64)
    y = np.array([c for _, c in pairs])
    clipped = np.clip(p, 1e-7, 1 - 1e-7)
    samples = gateway.scrape()
    labels = {"model": "kt", "version": "1"}
    assert value(samples, "routerkt_outcomes_total", **labels) == len(pairs)
    assert value(samples, "routerkt_outcome_log_loss_sum", **labels) == pytest.approx(
        -(y * np.log(clipped) + (1 - y) * np.log(1 - clipped)).sum(), abs=1e-6)
    assert value(samples, "routerkt_outcome_brier_sum", **labels) == pytest.approx(((p - y) ** 2).sum(), abs=1e-6)
    for bound in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0):
        le = f"{bound:g}" if bound != 1.0 else "1.0"
        assert value(samples, "routerkt_outcome_probability_bucket", **labels, le=le) == (p <= bound).sum()
        assert value(samples, "routerkt_outcome_correct_total", **labels, le=le) == ((p <= bound) & (y == 1)).sum()
    assert value(samples, "routerkt_online_outcomes", **labels) == len(pairs)
    assert 0.0 <= value(samples, "routerkt_online_auc", **labels) <= 1.0
    assert not any("learner-" in str(key) for key in samples)        # no learner in any label


def test_a_canary_splits_learners_by_weight_and_is_sticky(gateway) -> None:
    gateway.set_policy({"kt": {"policy": "canary", "baseline": 1, "candidate": 2, "weight": 0.2, "guardrail": None}})
    learners = [f"canary-{i}" for i in range(2000)]

    def versions() -> list[int]:
        out = []
        for start in range(0, len(learners), 64):
            response = gateway.stub.PredictBatch(pb.PredictBatchRequest(model="kt", learners=[
                pb.LearnerRequest(learner_id=lid, candidates=[pb.Candidate(question_id=1)])
                for lid in learners[start:start + 64]]), timeout=30)
            out += [r.version for r in response.results]
        return out
    first, second = versions(), versions()
    assert first == second                                         # one learner, one version
    assert abs(first.count(2) / len(first) - 0.2) < 0.03
    samples = gateway.scrape()
    assert value(samples, "routerkt_predictions_total", model="kt", version="2") == 2 * first.count(2)
    assert value(samples, "routerkt_rollout_weight", model="kt") == 0.2


def test_shadow_never_changes_a_response_and_its_outcomes_are_tracked(gateway, kt_repository) -> None:
    history = [pb.Interaction(question_id=q, skill_id=s, correct=c) for q, s, c in learner_sequences(kt_repository, 1, 12)[0]]
    requests = [pb.PredictRequest(model="kt", history=history[:n], candidates=[pb.Candidate(question_id=q)
                                                                               for q in (2, 9, 17)]) for n in range(1, 12)]
    gateway.set_policy({"kt": {"policy": "pinned", "version": 1}})
    plain = [gateway.stub.Predict(r, timeout=10) for r in requests]
    gateway.set_policy({"kt": {"policy": "shadow", "baseline": 1, "candidate": 2, "sample": 1.0}})
    shadowed = [gateway.stub.Predict(r, timeout=10) for r in requests]
    for a, b in zip(plain, shadowed):
        assert (list(a.probabilities), a.version) == (list(b.probabilities), b.version)
    deadline = time.monotonic() + 10
    while value(gateway.scrape(), "routerkt_shadow_predictions_total", model="kt", version="2") < 3 * len(requests):
        assert time.monotonic() < deadline, "the shadow version never scored"
        time.sleep(0.05)
    recorded = gateway.stub.ReportOutcome(pb.ReportOutcomeRequest(prediction_id=shadowed[-1].prediction_id,
                                                                  question_id=9, correct=1), timeout=10).recorded
    assert recorded == 2                                           # the answer and its shadow
    samples = gateway.scrape()
    assert value(samples, "routerkt_outcomes_total", model="kt", version="2") == 1


def test_the_guardrail_rolls_a_bad_canary_back(gateway, kt_repository) -> None:
    gateway.set_policy({"kt": {"policy": "canary", "baseline": 1, "candidate": 2, "weight": 0.5,
                               "guardrail": {"min_outcomes": 60, "max_log_loss_increase": 0.02}}})
    rolled_back = False
    for n, sequence in enumerate(learner_sequences(kt_repository, 80, 12)):
        learner = f"guard-{n}"
        for t, (q, s, c) in enumerate(sequence):
            gateway.stub.Predict(pb.PredictRequest(model="kt", learner_id=learner,
                                                   candidates=[pb.Candidate(question_id=q)]), timeout=10)
            gateway.stub.Observe(pb.ObserveRequest(learner_id=learner, events=[
                pb.Event(event_id=f"e{t}", question_id=q, skill_id=s, correct=c)]), timeout=10)
        if gateway.rollout()["models"]["kt"]["policy"] == "pinned":
            rolled_back = True
            break
    assert rolled_back, f"the guardrail never tripped: {gateway.rollout()}"
    samples = gateway.scrape()
    assert value(samples, "routerkt_rollout_rollbacks_total", model="kt") == 1
    n1 = value(samples, "routerkt_outcomes_total", model="kt", version="1")
    n2 = value(samples, "routerkt_outcomes_total", model="kt", version="2")
    assert n1 >= 60 and n2 >= 60
    on_disk = json.loads(gateway.policy_file.read_text())["models"]["kt"]
    assert on_disk["policy"] == "pinned" and on_disk["version"] == 1 and "guardrail" in on_disk["note"]
    response = gateway.stub.Predict(pb.PredictRequest(model="kt", learner_id="guard-0",
                                                      candidates=[pb.Candidate(question_id=1)]), timeout=10)
    assert response.version == 1


def test_a_malformed_policy_file_keeps_the_previous_policy(gateway, caplog) -> None:
    gateway.set_policy({"kt": {"policy": "pinned", "version": 1}})
    gateway.policy_file.write_text('{"format": 1, "models": {"kt": {"policy": "pinned", "version": 0}}}')
    deadline = time.monotonic() + 10
    while not gateway.rollout()["error"]:
        assert time.monotonic() < deadline, "the malformed file was never reported"
        time.sleep(0.05)
    status = gateway.rollout()
    assert status["error"].startswith("models.kt.version:")
    assert status["models"]["kt"] == {"policy": "pinned", "version": 1}
    samples = gateway.scrape()
    assert value(samples, "routerkt_rollout_policy_ok") == 0
    assert value(samples, "routerkt_rollout_policy_errors_total") == 1
    assert "refused" in caplog.text
    for _ in range(5):
        assert gateway.stub.Predict(pb.PredictRequest(model="kt", candidates=[pb.Candidate(question_id=1)]),
                                    timeout=10).version == 1


def test_the_http_mirror_reports_outcomes(gateway) -> None:
    body = {"model": "kt", "history": [{"question_id": 1, "correct": 1}], "candidates": [{"question_id": 2}]}
    predicted = httpx.post(gateway.http + "/v1/predict", json=body, timeout=10).json()
    assert len(predicted["prediction_id"]) == 32
    report = {"prediction_id": predicted["prediction_id"], "question_id": 2, "correct": 1}
    assert httpx.post(gateway.http + "/v1/report_outcome", json=report, timeout=10).json() == {"recorded": 1}
    assert httpx.post(gateway.http + "/v1/report_outcome", json=report, timeout=10).json() == {"recorded": 0}
    bad = httpx.post(gateway.http + "/v1/report_outcome", json={**report, "prediction_id": "nope"}, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "prediction_id"
    bad = httpx.post(gateway.http + "/v1/report_outcome", json={**report, "correct": True}, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "correct"
