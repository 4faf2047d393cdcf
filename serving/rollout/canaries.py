"""The canaries in force, each with what it is judged on: the outcome totals of both versions when it
began (the guardrail's baseline) and its sequential test fed by every later outcome."""
from __future__ import annotations

from dataclasses import dataclass

from serving.metrics import Metrics
from serving.rollout.kinds.base import Guardrail, Rollout, Split
from serving.rollout.sequential import Reading, SequentialTest


@dataclass
class CanaryStart:
    rollout: Rollout
    split: Split
    guard: Guardrail | None
    baseline: tuple[int, float]      # (outcomes, log-loss sum) when the canary began
    candidate: tuple[int, float]
    test: SequentialTest | None = None

    def test_json(self, reading: Reading | None = None) -> dict[str, object]:
        """The sequential test's state for /v1/rollout (a reading taken now unless one is given)."""
        assert self.test is not None
        reading = reading or self.test.read()
        return {"baseline": self.split.baseline, "candidate": self.split.candidate,
                **reading.to_json(self.test.alpha, self.test.min_outcomes)}


def since(now: tuple[int, float], then: tuple[int, float]) -> tuple[int, float]:
    return now[0] - then[0], now[1] - then[1]


class Canaries:
    """Model -> CanaryStart for every canary with a guardrail or a test; kept across unchanged policies."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.started: dict[str, CanaryStart] = {}

    def track(self, models: dict[str, Rollout]) -> None:
        """Start what is new in `models`, stop what is gone or changed, keep the rest with its counts."""
        kept: dict[str, CanaryStart] = {}
        for name, rollout in models.items():
            split = rollout.split()
            if split is None or (rollout.guardrail() is None and rollout.promotion() is None):
                continue
            old = self.started.get(name)
            kept[name] = old if old is not None and old.rollout == rollout else self._start(name, rollout, split)
        for name, start in self.started.items():
            if kept.get(name) is not start:
                self._stop(name, start)
        self.started = kept

    def outcomes_since(self, name: str) -> dict[str, dict[str, float]] | None:
        """Outcomes and log-loss sums of both versions since `name`'s canary began (None: no canary)."""
        start = self.started.get(name)
        if start is None:
            return None
        quality = self.metrics.quality
        return {str(v): dict(zip(("outcomes", "log_loss_sum"), since(quality.totals(name, v), then)))
                for v, then in ((start.split.baseline, start.baseline), (start.split.candidate, start.candidate))}

    def _start(self, name: str, rollout: Rollout, split: Split) -> CanaryStart:
        quality, promotion = self.metrics.quality, rollout.promotion()
        start = CanaryStart(rollout, split, rollout.guardrail(), quality.totals(name, split.baseline),
                            quality.totals(name, split.candidate))
        if promotion is not None:
            start.test = SequentialTest(promotion.alpha, promotion.min_outcomes)
            quality.follow(name, split.baseline, start.test.add_baseline)
            quality.follow(name, split.candidate, start.test.add_candidate)
        return start

    def _stop(self, name: str, start: CanaryStart) -> None:
        if start.test is not None:
            self.metrics.quality.unfollow(name, start.split.baseline, start.test.add_baseline)
            self.metrics.quality.unfollow(name, start.split.candidate, start.test.add_candidate)
            for bound in ("lower", "upper"):
                try:
                    self.metrics.rollout_difference.remove(name, bound)
                except KeyError:
                    pass
