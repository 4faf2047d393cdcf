"""serving/rollout/: the policy file's validation, canary routing (share, stickiness), shadow,
the guardrail, a malformed file keeping the last good policy, and `routerkt rollout`."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from routerkt.cli import main
from serving.status_errors import ServingError
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


class FakeReadiness:
    """The repository holds `held`; `ready` answer; ensure_ready loads what `loadable` lists."""

    def __init__(self, held: set[int], ready: set[int], loadable: set[int] = frozenset()) -> None:
        self.held, self._ready, self.loadable, self.asked = held, set(ready), set(loadable), []

    def versions(self, model: str) -> list[int]:
        return sorted(self.held)

    def ready(self, model: str) -> frozenset[int]:
        return frozenset(self._ready)

    async def ensure_ready(self, model: str, version: int, timeout_s: float) -> bool:
        self.asked.append(version)
        if version in self.loadable:
            self._ready.add(version)
        return version in self._ready


def test_a_change_naming_a_version_the_repository_lacks_is_refused(tmp_path: Path) -> None:
    import asyncio
    import grpc
    path = tmp_path / "rollout.json"
    write(path, canary(0.5))
    readiness = FakeReadiness(held={1, 2, 3}, ready={2, 3}, loadable={1})
    policy = RolloutPolicy(path, Metrics(), KEYS, readiness=readiness)
    with pytest.raises(ServingError) as info:
        asyncio.run(policy.change("kt", {"policy": "pinned", "version": 7}))
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION and "version 7 is not in the model repository" \
        in info.value.message
    assert json.loads(path.read_text())["models"]["kt"]["policy"] == "canary"        # nothing changed
    # held but not loaded: loaded first, then in force at once (no poll needed)
    assert asyncio.run(policy.change("kt", {"policy": "pinned", "version": 1})) == {"policy": "pinned", "version": 1}
    assert readiness.asked == [1] and policy.policy.get("kt") == Pinned(1)
    readiness.held.add(9)
    with pytest.raises(ServingError) as info:                                          # held, never loads
        asyncio.run(policy.change("kt", {"policy": "pinned", "version": 9}))
    assert info.value.code == grpc.StatusCode.UNAVAILABLE and policy.policy.get("kt") == Pinned(1)


def test_routing_and_the_weight_gauge_say_what_is_routed(tmp_path: Path) -> None:
    """The second-night failure: the baseline unloaded, every learner on the candidate, while the gauge said 0.5."""
    path = tmp_path / "rollout.json"
    write(path, canary(0.5))
    readiness = FakeReadiness(held={1, 2}, ready={2})
    metrics = Metrics()
    policy = RolloutPolicy(path, metrics, KEYS, readiness=readiness)
    gauge = lambda: metrics.registry.get_sample_value("routerkt_rollout_weight", {"model": "kt"})  # noqa: E731
    assert gauge() == 1.0
    routing = policy.status()["models"]["kt"]["routing"]
    assert routing["candidate_share"] == 1.0 and "baseline 1 does not answer" in routing["note"]
    readiness._ready.add(1)
    policy.publish_routing()
    assert gauge() == 0.5 and "note" not in policy.status()["models"]["kt"]["routing"]


def test_a_file_naming_a_missing_version_keeps_the_previous_policy_until_it_appears(tmp_path: Path) -> None:
    path = tmp_path / "rollout.json"
    write(path, {"kt": {"policy": "pinned", "version": 1}})
    readiness = FakeReadiness(held={1, 2}, ready={1, 2})
    policy = RolloutPolicy(path, Metrics(), KEYS, readiness=readiness)
    write(path, {"kt": {"policy": "pinned", "version": 3}})
    assert not policy.check_file() and policy.policy.get("kt") == Pinned(1)
    assert "version 3 is not in the model repository" in policy.status()["error"]
    readiness.held.add(3)                                      # published a moment later: read again next poll
    assert policy.check_file() and policy.policy.get("kt") == Pinned(3) and policy.status()["error"] is None


def test_rollout_json_put_and_one_source_of_truth(tmp_path: Path, capsys) -> None:
    path = str(tmp_path / "rollout.json")
    assert main(["rollout", "status", "--json", "--file", path]) == 0
    view = json.loads(capsys.readouterr().out)
    assert (view["exists"], view["models"]) == (False, {})
    assert main(["rollout", "set", "kt", "canary", "--baseline", "1", "--candidate", "2", "--weight", "0.2",
                 "--note", "night 1", "--json", "--file", path]) == 0
    changed = json.loads(capsys.readouterr().out)
    assert (changed["versions"], changed["served"], changed["split"]) == ([1, 2], 1, {"baseline": 1, "candidate": 2})
    assert changed["entry"]["note"] == "night 1"
    assert main(["rollout", "put", "kt", '{"policy": "pinned", "version": 2}', "--file", path]) == 0
    capsys.readouterr()
    assert main(["rollout", "status", "--json", "--file", path]) == 0
    assert json.loads(capsys.readouterr().out)["models"]["kt"]["served"] == 2
    assert main(["rollout", "put", "kt", '{"policy": "pinned"}', "--file", path]) == 2
    assert "entry: models.kt.version" in capsys.readouterr().err
    assert main(["rollout", "rollback", "kt", "--file", path, "--gateway", "http://127.0.0.1:1"]) == 2
    assert "--gateway and --file" in capsys.readouterr().err
