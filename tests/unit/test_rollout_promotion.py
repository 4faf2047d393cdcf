"""RolloutPolicy with a canary's sequential test: a better candidate is pinned (file rewritten with
a note, routerkt_rollout_decisions_total counted, status() shows it), a worse one rolled back,
`promotion: null` never decides, the policy field and the `routerkt rollout` flags."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from routerkt.cli import main
from serving.metrics import Metrics
from serving.rollout.kinds.base import Promotion
from serving.rollout.kinds.canary import Canary
from serving.rollout.kinds.pinned import Pinned
from serving.rollout.policy import RolloutPolicy
from serving.rollout.policy_file import PolicyError, parse_policy, read_policy
from serving.sessions.keys import LearnerKeys

pytestmark = pytest.mark.unit

KEYS = LearnerKeys(b"rollout-test-secret-32-bytes-ok!")


def canary(**promotion) -> dict:
    return {"format": 1, "models": {"kt": {"policy": "canary", "baseline": 1, "candidate": 2, "weight": 0.5,
                                           "guardrail": None, "promotion": promotion or {}}}}


def feed(metrics: Metrics, n: int, baseline_p: float, candidate_p: float) -> None:
    """n outcomes per version, every answer correct: the loss is -ln p."""
    for _ in range(n):
        metrics.quality.add_outcome("kt", 1, baseline_p, 1)
        metrics.quality.add_outcome("kt", 2, candidate_p, 1)


def sample(metrics: Metrics, name: str, **labels) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_a_better_candidate_is_promoted_and_the_file_says_so(tmp_path: Path) -> None:
    path = tmp_path / "rollout.json"
    path.write_text(json.dumps(canary(alpha=0.05, min_outcomes=200)))
    metrics = Metrics()
    policy = RolloutPolicy(path, metrics, KEYS)
    feed(metrics, 199, 0.5, 0.9)
    assert policy.check_guardrails() == []                            # 199 < min_outcomes
    state = policy.status()["sequential_tests"]["kt"]
    assert state["decision"] == "continue" and state["outcomes"] == {"baseline": 199, "candidate": 199}
    assert state["difference"]["upper"] < 0                           # already proven: min_outcomes holds it
    assert sample(metrics, "routerkt_rollout_log_loss_difference", model="kt", bound="upper") == \
        pytest.approx(state["difference"]["upper"], abs=1e-6)
    feed(metrics, 1, 0.5, 0.9)
    assert policy.check_guardrails() == ["kt"]
    assert policy.policy.get("kt") == read_policy(path).get("kt")
    pinned = read_policy(path).get("kt")
    assert isinstance(pinned, Pinned) and pinned.version == 2
    assert "promoted by the sequential test" in pinned.note and "after 200 / 200 outcomes" in pinned.note
    assert sample(metrics, "routerkt_rollout_decisions_total", model="kt", decision="promote") == 1
    assert sample(metrics, "routerkt_rollout_decisions_total", model="kt", decision="rollback") is None
    assert sample(metrics, "routerkt_rollout_log_loss_difference", model="kt", bound="upper") is None
    status = policy.status()
    assert status["models"]["kt"]["policy"] == "pinned"
    assert status["sequential_tests"]["kt"]["decision"] == "promote"      # kept while its pin is in force
    assert policy.check_file() is False                                     # its own rewrite changes nothing
    feed(metrics, 100, 0.1, 0.9)                                            # the test no longer listens
    assert policy.check_guardrails() == [] and not metrics.quality._followers
    path.write_text(json.dumps({"format": 1, "models": {"kt": {"policy": "pinned", "version": 1}}}))
    assert policy.check_file() and "kt" not in policy.status()["sequential_tests"]


def test_a_worse_candidate_is_rolled_back_by_the_test(tmp_path: Path) -> None:
    path = tmp_path / "rollout.json"
    path.write_text(json.dumps(canary(min_outcomes=20)))
    metrics = Metrics()
    policy = RolloutPolicy(path, metrics, KEYS)
    feed(metrics, 200, 0.9, 0.4)
    assert policy.check_guardrails() == ["kt"]
    pinned = read_policy(path).get("kt")
    assert pinned.version == 1 and "rolled back by the sequential test" in pinned.note
    assert sample(metrics, "routerkt_rollout_decisions_total", model="kt", decision="rollback") == 1
    assert sample(metrics, "routerkt_rollout_rollbacks_total", model="kt") is None     # not the guardrail


def test_outcomes_before_the_canary_and_a_disabled_test_decide_nothing(tmp_path: Path) -> None:
    path = tmp_path / "rollout.json"
    metrics = Metrics()
    feed(metrics, 500, 0.5, 0.95)                                  # before the canary began
    path.write_text(json.dumps(canary(min_outcomes=20)))
    policy = RolloutPolicy(path, metrics, KEYS)
    assert policy.check_guardrails() == []
    assert policy.status()["sequential_tests"]["kt"]["outcomes"] == {"baseline": 0, "candidate": 0}
    doc = canary()
    doc["models"]["kt"]["promotion"] = None
    path.write_text(json.dumps(doc))
    assert policy.check_file()
    feed(metrics, 500, 0.5, 0.95)
    assert policy.check_guardrails() == [] and policy.status()["sequential_tests"] == {}
    assert isinstance(policy.policy.get("kt"), Canary)


def test_the_promotion_field_defaults_and_is_validated() -> None:
    plain = {"policy": "canary", "baseline": 1, "candidate": 2, "weight": 0.1}
    got = parse_policy(json.dumps({"models": {"kt": plain}})).get("kt")
    assert got.promotion() == Promotion(0.05, 200)
    assert got.to_json()["promotion"] == {"alpha": 0.05, "min_outcomes": 200}
    for bad, field in (({"alpha": 0}, "alpha"), ({"alpha": 1.0}, "alpha"), ({"alpha": True}, "alpha"),
                       ({"min_outcomes": 0}, "min_outcomes"), ({"beta": 1}, "beta")):
        with pytest.raises(PolicyError) as info:
            parse_policy(json.dumps({"models": {"kt": {**plain, "promotion": bad}}}))
        assert str(info.value).startswith(f"models.kt.promotion.{field}:")
    with pytest.raises(PolicyError, match="models.kt.promotion: must be an object or null"):
        parse_policy(json.dumps({"models": {"kt": {**plain, "promotion": 0.05}}}))


def test_the_cli_flags(tmp_path: Path, capsys) -> None:
    path = tmp_path / "rollout.json"
    base = ["rollout", "set", "kt", "canary", "--baseline", "1", "--candidate", "2", "--weight", "0.2",
            "--file", str(path)]
    assert main(base + ["--alpha", "0.01", "--promotion-min-outcomes", "400", "--min-outcomes", "300"]) == 0
    got = read_policy(path).get("kt")
    assert got.promotion() == Promotion(0.01, 400) and got.guardrail().min_outcomes == 300
    assert main(base + ["--no-promotion"]) == 0 and read_policy(path).get("kt").promotion() is None
    capsys.readouterr()
    for flags, named in ((["--alpha", "2"], "--alpha"), (["--promotion-min-outcomes", "0"], "--promotion-min-outcomes"),
                         (["--no-promotion", "--alpha", "0.1"], "--no-promotion")):
        assert main(base + flags) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and named in err[0], err


def test_status_prints_the_gateways_sequential_test(tmp_path: Path, capsys) -> None:
    path = tmp_path / "rollout.json"
    path.write_text(json.dumps(canary(min_outcomes=20)))
    metrics = Metrics()
    policy = RolloutPolicy(path, metrics, KEYS)
    feed(metrics, 30, 0.6, 0.62)
    body = json.dumps({**policy.status(), "quality": metrics.quality.summary()}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None: ...

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert main(["rollout", "status", "--file", str(path), "--gateway",
                     f"http://127.0.0.1:{server.server_port}"]) == 0
    finally:
        server.shutdown()
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "sequential test kt" in x)
    assert "candidate 2 - baseline 1" in line and "30 / 30" in line and "no decision yet" in line, line
