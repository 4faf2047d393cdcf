"""The canary's online promotion test: an anytime-valid confidence sequence for candidate - baseline
mean clipped log loss.

Method (docs/operations.md, "Online promotion"): each outcome's log loss is clipped to [0, LOSS_CLIP]
and scaled to [0, 1]. Each arm (baseline, candidate) keeps a predictable plug-in empirical-Bernstein
confidence sequence for its mean (Waudby-Smith and Ramdas, "Estimating means of bounded random
variables by betting", JRSS-B 2023, Theorem 2): with L = log(4 / alpha),

    mu_hat_t   = (1/2 + sum x_i) / (t + 1)                    sigma2_t = (1/4 + sum (x_i - mu_hat_i)^2) / (t + 1)
    lambda_i   = min(sqrt(2 L / (sigma2_{i-1} i log(1 + i))), 1/2)
    penalty_i  = (x_i - mu_hat_{i-1})^2 (-log(1 - lambda_i) - lambda_i)
    bounds_t   = sum lambda_i x_i / sum lambda_i  -/+  (L + sum penalty_i) / sum lambda_i

Each side of each arm is a nonnegative supermartingale crossing 1 / (alpha / 4) with probability at
most alpha / 4 at ANY time (Ville), so with probability >= 1 - alpha all four bounds hold at once,
for every t: [lower_c - upper_b, upper_c - lower_b] then contains the true difference whenever it
is read. The bounds are intersected over time (running max / min). Promote when the upper end is
below 0 (candidate better), roll back when the lower end is above 0. Everything updates in O(1) per
outcome; the arithmetic works on floats and on numpy arrays alike (the simulation test runs 1,000
experiments at once through the same code).
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

LOSS_CLIP = 5.0           # nats: a loss above it (p < e^-5 = 0.0067 for what happened) counts as 5
LAMBDA_CAP = 0.5          # the bet size cap c of the method
PROMOTE, ROLLBACK = "promote", "rollback"


def log_term(alpha: float) -> float:
    """L = log(4 / alpha): each of the four one-sided bounds gets alpha / 4."""
    return math.log(4.0 / alpha)


class ArmBounds:
    """The confidence sequence of one arm's mean scaled loss (x in [0, 1]); fields are floats, or
    numpy arrays of one shape when `shape` is given (many experiments side by side)."""

    def __init__(self, alpha: float, shape: tuple[int, ...] | None = None) -> None:
        self.level = log_term(alpha)
        zero = (lambda: 0.0) if shape is None else (lambda: np.zeros(shape))
        self.n = zero()
        self.total = zero()          # sum x_i
        self.spread = zero()         # sum (x_i - mu_hat_i)^2
        self.bets = zero()           # sum lambda_i
        self.bet_total = zero()      # sum lambda_i x_i
        self.penalty = zero()        # sum (x_i - mu_hat_{i-1})^2 (-log(1 - lambda_i) - lambda_i)
        self.lower = zero()
        self.upper = zero() + 1.0

    def add(self, x) -> None:
        """One outcome (x already scaled to [0, 1]); arrays: one per experiment."""
        i = self.n + 1
        mean_before = (0.5 + self.total) / i
        var_before = (0.25 + self.spread) / i
        bet = np.minimum(np.sqrt(2.0 * self.level / (var_before * i * np.log1p(i))), LAMBDA_CAP)
        penalty = (x - mean_before) ** 2 * (-np.log1p(-bet) - bet)
        total = self.total + x
        spread = self.spread + (x - (0.5 + total) / (i + 1)) ** 2
        bets, bet_total, penalty = self.bets + bet, self.bet_total + bet * x, self.penalty + penalty
        centre, radius = bet_total / bets, (self.level + penalty) / bets
        lower, upper = np.maximum(self.lower, centre - radius), np.minimum(self.upper, centre + radius)
        new = {"n": i, "total": total, "spread": spread, "bets": bets, "bet_total": bet_total, "penalty": penalty,
               "lower": lower, "upper": upper}
        for name, value in new.items():
            setattr(self, name, float(value) if np.ndim(value) == 0 else value)


def scaled(loss):
    """A log loss (nats) clipped to [0, LOSS_CLIP] and scaled to [0, 1]."""
    return np.minimum(np.maximum(loss, 0.0), LOSS_CLIP) / LOSS_CLIP


def difference(candidate: ArmBounds, baseline: ArmBounds):
    """(lower, upper) of candidate - baseline mean clipped log loss, in nats."""
    return (LOSS_CLIP * (candidate.lower - baseline.upper), LOSS_CLIP * (candidate.upper - baseline.lower))


def decide(candidate: ArmBounds, baseline: ArmBounds, min_outcomes: int):
    """PROMOTE / ROLLBACK / "" (arrays: an array of them) once both arms have min_outcomes."""
    lower, upper = difference(candidate, baseline)
    enough = np.minimum(candidate.n, baseline.n) >= min_outcomes
    verdict = np.where(enough & (upper < 0), PROMOTE, np.where(enough & (lower > 0), ROLLBACK, ""))
    return str(verdict) if np.ndim(verdict) == 0 else verdict


@dataclass(frozen=True)
class Reading:
    """What the test says now (for /v1/rollout, the CLI and the gauges)."""

    outcomes: tuple[int, int]                   # (baseline, candidate)
    mean_clipped_log_loss: tuple[float | None, float | None]
    lower: float                                # candidate - baseline, nats
    upper: float
    decision: str                               # promote, rollback or "" (keep the split)

    def to_json(self, alpha: float, min_outcomes: int) -> dict[str, object]:
        return {"alpha": alpha, "min_outcomes": min_outcomes,
                "outcomes": {"baseline": self.outcomes[0], "candidate": self.outcomes[1]},
                "mean_clipped_log_loss": {"baseline": self.mean_clipped_log_loss[0],
                                          "candidate": self.mean_clipped_log_loss[1]},
                "difference": {"lower": round(self.lower, 6), "upper": round(self.upper, 6)},
                "decision": self.decision or "continue"}


class SequentialTest:
    """One canary's test: feed each arm's log losses (thread-safe, O(1)), read() any time."""

    def __init__(self, alpha: float, min_outcomes: int) -> None:
        self.alpha, self.min_outcomes = alpha, min_outcomes
        self.baseline, self.candidate = ArmBounds(alpha), ArmBounds(alpha)
        self._lock = threading.Lock()

    def add_baseline(self, loss: float) -> None:
        with self._lock:
            self.baseline.add(float(scaled(loss)))

    def add_candidate(self, loss: float) -> None:
        with self._lock:
            self.candidate.add(float(scaled(loss)))

    def read(self) -> Reading:
        with self._lock:
            baseline, candidate = self.baseline, self.candidate
            lower, upper = difference(candidate, baseline)
            return Reading((int(baseline.n), int(candidate.n)), (_mean(baseline), _mean(candidate)), float(lower),
                           float(upper), decide(candidate, baseline, self.min_outcomes))


def _mean(arm: ArmBounds) -> float | None:
    return round(LOSS_CLIP * arm.total / arm.n, 6) if arm.n else None
