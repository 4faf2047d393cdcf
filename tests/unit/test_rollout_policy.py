"""serving/rollout/: the policy file's validation, canary routing (share, stickiness), shadow,
the guardrail, a malformed file keeping the last good policy, and `routerkt rollout`."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from routerkt.cli import main
from serving.errors import ServingError
from serving.metrics import Metrics
from serving.rollout.policy import RolloutPolicy
from serving.rollout.kinds import KINDS
from serving.rollout.kinds.base import Rollout
from serving.rollout.kinds.canary import Canary
from serving.rollout.kinds.pinned import Pinned
from serving.rollout.policy_file import PolicyError, parse_policy, read_policy
from serving.sessions.keys import LearnerKeys

pytestmark = pytest.mark.unit

KEYS = LearnerKeys(b"rollout-test-secret-32-bytes-ok!")


class Version:
    def __init__(self, version: int) -> None:
        self.version, self.name = version, "kt"


CATALOG = {1: Version(1), 2: Version(2)}


def write(path: Path, models: dict) -> None:
    path.write_text(json.dumps({"format": 1, "models": models}))


def canary(weight: float, **guardrail) -> dict:
    return {"kt": {"policy": "canary", "baseline": 1, "candidate": 2, "weight": weight,
                   **({"guardrail": guardrail} if guardrail else {})}}


@pytest.mark.parametrize("models, field", [
    ({"kt": {"policy": "sometimes"}}, "models.kt.policy"),
    ({"kt": {"policy": "pinned"}}, "models.kt.version"),
    ({"kt": {"policy": "pinned", "version": True}}, "models.kt.version"),
    ({"kt": {"policy": "canary", "baseline": 1, "candidate": 2, "weight": 1.5}}, "models.kt.weight"),
    ({"kt": {"policy": "canary", "baseline": 2, "candidate": 2, "weight": 0.5}}, "models.kt.candidate"),
    ({"kt": {"policy": "canary", "baseline": 1, "candidate": 2, "weight": 0.5, "sample": 1}}, "models.kt.sample"),
    ({"kt": {"policy": "canary", "baseline": 1, "candidate": 2, "weight": 0.5,
             "guardrail": {"min_outcomes": 0}}}, "models.kt.guardrail.min_outcomes"),
    ({"kt": {"policy": "shadow", "baseline": 1, "candidate": 2, "sample": -0.1}}, "models.kt.sample"),
])
def test_a_bad_policy_names_its_field(models: dict, field: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(json.dumps({"format": 1, "models": models}))
    assert str(info.value).startswith(field + ":")


def test_not_json_is_refused_with_its_position() -> None:
    with pytest.raises(PolicyError, match="not valid JSON"):
        parse_policy('{"models": ')


def test_a_canary_sends_the_weight_of_learners_to_the_candidate_and_is_sticky(tmp_path: Path) -> None:
    path = tmp_path / "rollout.json"
    write(path, canary(0.2))
    policy = RolloutPolicy(path, Metrics(), KEYS)
    learners = [f"learner-{i}" for i in range(2000)]
    first = [policy.route("kt", 0, CATALOG, frozenset({1, 2}), lid).primary.version for lid in learners]
    again = [policy.route("kt", 0, CATALOG, frozenset({1, 2}), lid).primary.version for lid in learners]
    assert first == again
    assert abs(first.count(2) / len(first) - 0.2) < 0.03
    write(path, canary(0.5))
    policy.check_file()
    wider = [policy.route("kt", 0, CATALOG, frozenset({1, 2}), lid).primary.version for lid in learners]
    assert all(w == 2 for f, w in zip(first, wider) if f == 2)       # raising the weight moves only to B
    assert policy.metrics.registry.get_sample_value("routerkt_rollout_weight", {"model": "kt"}) == 0.5


def test_a_canary_whose_candidate_is_not_ready_serves_the_baseline(tmp_path: Path) -> None:
    path = tmp_path / "rollout.json"
    write(path, canary(1.0))
    policy = RolloutPolicy(path, Metrics(), KEYS)
    assert policy.route("kt", 0, CATALOG, frozenset({1}), "someone").primary.version == 1
    assert policy.route("kt", 0, CATALOG, frozenset({1, 2}), "someone").primary.version == 2
    assert policy.route("kt", 1, CATALOG, frozenset({1, 2}), "someone").primary.version == 1   # request pins
    with pytest.raises(ServingError):
        policy.route("kt", 0, CATALOG, frozenset(), "someone")


def test_shadow_answers_with_the_baseline_and_samples_the_candidate(tmp_path: Path) -> None:
    path = tmp_path / "rollout.json"
    write(path, {"kt": {"policy": "shadow", "baseline": 1, "candidate": 2, "sample": 0.25}})
    policy = RolloutPolicy(path, Metrics(), KEYS, rng=random.Random(0))
    routes = [policy.route("kt", 0, CATALOG, frozenset({1, 2}), "") for _ in range(4000)]
    assert {r.primary.version for r in routes} == {1}
    assert abs(sum(r.shadow is not None for r in routes) / 4000 - 0.25) < 0.03


def test_a_malformed_file_keeps_the_last_good_policy(tmp_path: Path) -> None:
    path = tmp_path / "rollout.json"
    write(path, {"kt": {"policy": "pinned", "version": 1}})
    metrics = Metrics()
    policy = RolloutPolicy(path, metrics, KEYS)
    path.write_text('{"format": 1, "models": {"kt": {"policy": "pinned", "version": "two"}}}')
    assert policy.check_file() is False
    assert policy.policy.get("kt").name == Pinned.name and policy.policy.get("kt").version == 1
    assert policy.error.startswith("models.kt.version:")
    assert metrics.registry.get_sample_value("routerkt_rollout_policy_ok") == 0
    assert metrics.registry.get_sample_value("routerkt_rollout_policy_errors_total") == 1
    write(path, {"kt": {"policy": "pinned", "version": 2}})
    assert policy.check_file() is True and policy.error is None
    assert metrics.registry.get_sample_value("routerkt_rollout_policy_ok") == 1


def test_the_guardrail_rolls_a_worse_canary_back_after_min_outcomes(tmp_path: Path) -> None:
    path = tmp_path / "rollout.json"
    write(path, canary(0.5, min_outcomes=50, max_log_loss_increase=0.05))
    metrics = Metrics()
    policy = RolloutPolicy(path, metrics, KEYS)
    for _ in range(49):
        metrics.quality.add_outcome("kt", 1, 0.8, 1)       # baseline: right
        metrics.quality.add_outcome("kt", 2, 0.2, 1)       # candidate: wrong
    assert policy.check_guardrails() == []            # 49 < 50 outcomes: no verdict yet
    metrics.quality.add_outcome("kt", 1, 0.8, 1)
    metrics.quality.add_outcome("kt", 2, 0.2, 1)
    assert policy.check_guardrails() == ["kt"]
    assert policy.policy.get("kt").name == Pinned.name and policy.policy.get("kt").version == 1
    assert metrics.registry.get_sample_value("routerkt_rollout_rollbacks_total", {"model": "kt"}) == 1
    on_disk = read_policy(path).get("kt")
    assert on_disk.name == Pinned.name and on_disk.version == 1 and "guardrail" in on_disk.note
    assert policy.check_file() is False               # the gateway's own rewrite changes nothing


def test_the_guardrail_keeps_a_canary_that_is_as_good(tmp_path: Path) -> None:
    path = tmp_path / "rollout.json"
    write(path, canary(0.5, min_outcomes=20))
    metrics = Metrics()
    policy = RolloutPolicy(path, metrics, KEYS)
    for i in range(40):
        metrics.quality.add_outcome("kt", 1, 0.7, i % 3 != 0)
        metrics.quality.add_outcome("kt", 2, 0.7, i % 3 != 0)
    assert policy.check_guardrails() == []
    assert policy.policy.get("kt").name == Canary.name


def test_outcomes_before_the_canary_began_do_not_count(tmp_path: Path) -> None:
    path = tmp_path / "rollout.json"
    metrics = Metrics()
    for _ in range(100):
        metrics.quality.add_outcome("kt", 2, 0.01, 1)      # a terrible past of version 2
        metrics.quality.add_outcome("kt", 1, 0.99, 1)
    write(path, canary(0.5, min_outcomes=50))
    policy = RolloutPolicy(path, metrics, KEYS)
    assert policy.check_guardrails() == []


def test_the_cli_sets_promotes_and_rolls_back(tmp_path: Path, capsys) -> None:
    path = tmp_path / "rollout.json"
    assert main(["rollout", "set", "kt", "canary", "--baseline", "1", "--candidate", "2", "--weight", "0.2",
                 "--min-outcomes", "300", "--file", str(path)]) == 0
    got = read_policy(path).get("kt")
    assert (got.name, got.weight, got.guardrail().min_outcomes) == (Canary.name, 0.2, 300)
    assert main(["rollout", "promote", "kt", "--file", str(path)]) == 0
    assert read_policy(path).get("kt") == Pinned(2, note="promote: canary of 2 over 1")
    assert main(["rollout", "set", "kt", "shadow", "--baseline", "2", "--candidate", "3", "--file", str(path)]) == 0
    assert main(["rollout", "rollback", "kt", "--file", str(path)]) == 0
    assert read_policy(path).get("kt").version == 2
    assert main(["rollout", "status", "--file", str(path)]) == 0
    assert '"policy": "pinned"' in capsys.readouterr().out
    assert main(["rollout", "set", "kt", "canary", "--baseline", "1", "--candidate", "2", "--weight", "7",
                 "--file", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--weight" in err[0]
    assert main(["rollout", "promote", "kt", "--file", str(path)]) == 2        # pinned: nothing to promote


def test_every_kind_in_the_table_round_trips_and_routes(tmp_path: Path) -> None:
    """The one table of kinds: each entry is a Rollout whose JSON parses back to itself."""
    examples = {"latest": {"policy": "latest"}, "pinned": {"policy": "pinned", "version": 2},
                "canary": {"policy": "canary", "baseline": 1, "candidate": 2, "weight": 0.5},
                "shadow": {"policy": "shadow", "baseline": 1, "candidate": 2, "sample": 0.5}}
    assert set(KINDS) == set(examples)
    for name, kind in KINDS.items():
        assert issubclass(kind, Rollout) and kind.name == name
        parsed = parse_policy(json.dumps({"format": 1, "models": {"kt": examples[name]}})).get("kt")
        assert isinstance(parsed, kind)
        assert parse_policy(json.dumps({"format": 1, "models": {"kt": parsed.to_json()}})).get("kt") == parsed
        write(tmp_path / f"{name}.json", {"kt": examples[name]})
        route = RolloutPolicy(tmp_path / f"{name}.json", Metrics(), KEYS).route("kt", 0, CATALOG, frozenset({1, 2}),
                                                                               "learner-1")
        assert route.primary.version in (1, 2)


def test_a_flag_of_another_kind_is_refused_naming_it(tmp_path: Path, capsys) -> None:
    path = tmp_path / "rollout.json"
    assert main(["rollout", "set", "kt", "pinned", "--version", "1", "--weight", "0.5", "--file", str(path)]) == 2
    assert "--weight" in capsys.readouterr().err
