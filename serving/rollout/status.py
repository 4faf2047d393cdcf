"""What GET /v1/rollout shows of the rollout: the policy in force, a refused file's error, each model's
outcomes since its canary began and its routing as it is, and every canary's sequential test."""
from __future__ import annotations

from pathlib import Path

from serving.rollout.canaries import Canaries
from serving.rollout.kinds.base import Rollout
from serving.rollout.policy_file import RolloutPolicyFile
from serving.rollout.readiness import Readiness, routing


def policy_status(path: Path | None, error: str | None, policy: RolloutPolicyFile, canaries: Canaries,
                  readiness: Readiness | None,
                  decided: dict[str, tuple[Rollout, dict[str, object]]]) -> dict[str, object]:
    """`decided`: model -> (the pin a test wrote, the test's state then), shown while that pin holds."""
    models = {}
    for name, rollout in policy.models.items():
        entry: dict[str, object] = rollout.to_json()
        outcomes = canaries.outcomes_since(name)
        if outcomes is not None:
            entry["since_canary_began"] = outcomes
        if readiness is not None:
            entry["routing"] = routing(name, rollout, readiness)
        models[name] = entry
    tests = {name: start.test_json() for name, start in canaries.started.items() if start.test is not None}
    tests.update({name: state for name, (pin, state) in decided.items() if policy.models.get(name) == pin})
    return {"file": str(path) if path else None, "error": error, "models": models, "sequential_tests": tests}
