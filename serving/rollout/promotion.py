"""A canary's sequential test read once per poll: the interval published as a gauge, and when it decides,
which version to pin and why (serving/rollout/sequential.py holds the test itself)."""
from __future__ import annotations

from dataclasses import dataclass

from serving.metrics import Metrics
from serving.rollout.canaries import CanaryStart
from serving.rollout.sequential import PROMOTE


@dataclass(frozen=True)
class Decision:
    version: int                   # the version to pin
    decision: str                  # PROMOTE or ROLLBACK (the metric's label)
    verdict: str                   # "promoted" | "rolled back"
    reason: str
    state: dict[str, object]       # the test's state when it decided (kept in /v1/rollout while the pin holds)


def read_test(metrics: Metrics, name: str, start: CanaryStart) -> Decision | None:
    """Publish the interval (routerkt_rollout_log_loss_difference) and return the test's decision, if any."""
    if start.test is None:
        return None
    reading = start.test.read()
    if min(reading.outcomes) > 0:
        metrics.rollout_difference.labels(model=name, bound="lower").set(reading.lower)
        metrics.rollout_difference.labels(model=name, bound="upper").set(reading.upper)
    if not reading.decision:
        return None
    promote = reading.decision == PROMOTE
    reason = (f"candidate - baseline mean clipped log loss in [{reading.lower:+.4f}, {reading.upper:+.4f}] "
              f"at confidence {1 - start.test.alpha:g} after {reading.outcomes[1]} / {reading.outcomes[0]} outcomes")
    return Decision(start.split.candidate if promote else start.split.baseline, reading.decision,
                    "promoted" if promote else "rolled back", reason, start.test_json(reading))
