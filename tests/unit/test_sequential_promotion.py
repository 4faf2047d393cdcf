"""The canary's sequential test (serving/rollout/sequential.py) by simulation, vectorised over
experiments through the same ArmBounds code the gateway runs: A/A experiments decide falsely at most
alpha of the time (read after EVERY outcome), a better candidate is promoted and a worse one rolled
back, and how many outcomes that took (printed; docs/operations.md quotes them)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from serving.rollout.sequential import PROMOTE, ROLLBACK, ArmBounds, SequentialTest, decide, scaled

pytestmark = pytest.mark.unit

ALPHA = 0.05


def log_losses(rng: np.random.Generator, sharpness: np.ndarray) -> np.ndarray:
    """One outcome per experiment: the answer's chance q ~ U(0.05, 0.95); the model predicts
    sigmoid(sharpness * logit q) (1: calibrated, < 1: under-confident, > 1: over-confident)."""
    q = rng.uniform(0.05, 0.95, sharpness.shape)
    y = rng.random(sharpness.shape) < q
    p = 1.0 / (1.0 + np.exp(-sharpness * np.log(q / (1.0 - q))))
    return np.where(y, -np.log(p), -np.log1p(-p))


def simulate(candidate: np.ndarray, baseline: np.ndarray, per_round: int, rounds: int, seed: int,
             min_outcomes: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Experiments side by side; each round gives the candidate 1 outcome and the baseline
    `per_round` (weight 1 / (1 + per_round)); the decision is read after every round. Returns each
    experiment's decision ("" none) and the candidate outcomes it took (0: none)."""
    rng = np.random.default_rng(seed)
    c, b = ArmBounds(ALPHA, candidate.shape), ArmBounds(ALPHA, candidate.shape)
    decision = np.full(candidate.shape, "", dtype=object)
    when = np.zeros(candidate.shape, dtype=np.int64)
    for step in range(1, rounds + 1):
        c.add(scaled(log_losses(rng, candidate)))
        for _ in range(per_round):
            b.add(scaled(log_losses(rng, baseline)))
        now = decide(c, b, min_outcomes)
        new = (decision == "") & (now != "")
        decision[new], when[new] = now[new], step
        if (decision != "").all():
            break
    return decision, when


def test_a_a_experiments_decide_falsely_at_most_alpha_of_the_time() -> None:
    """1,000 A/A experiments (half a calibrated model, half an over-confident one with heavier-tailed
    losses), at canary weight 0.2, 2,000 candidate + 8,000 baseline outcomes each, read after every round."""
    n = 1000
    sharpness = np.where(np.arange(n) < n // 2, 1.0, 1.8)
    decision, _ = simulate(sharpness, sharpness, per_round=4, rounds=2000, seed=11)
    false = int((decision != "").sum())
    margin = 3 * math.sqrt(ALPHA * (1 - ALPHA) / n)
    print(f"\nA/A: {false} of {n} experiments decided (promote {int((decision == PROMOTE).sum())}, "
          f"rollback {int((decision == ROLLBACK).sum())}); bound alpha + 3 sd = {ALPHA + margin:.3f}")
    assert false / n <= ALPHA + margin


@pytest.mark.parametrize("baseline, per_round, gap", [(0.3, 1, 0.067), (0.5, 1, 0.032), (0.3, 4, 0.067)])
def test_a_better_candidate_is_promoted_and_the_outcomes_it_took(baseline: float, per_round: int, gap: float) -> None:
    """A calibrated candidate against an under-confident baseline (gap: their mean log-loss
    difference, nats, measured over 1e6 draws below)."""
    rng = np.random.default_rng(5)
    measured = log_losses(rng, np.full(10**6, baseline)).mean() - log_losses(rng, np.ones(10**6)).mean()
    assert measured == pytest.approx(gap, abs=0.002)
    n = 200
    decision, when = simulate(np.ones(n), np.full(n, baseline), per_round, rounds=30000 // per_round, seed=7)
    assert (decision == ROLLBACK).sum() == 0
    promoted = decision == PROMOTE
    assert promoted.mean() >= 0.95
    median, p90 = np.percentile(when[promoted], [50, 90])
    print(f"\nbetter by {measured:.3f} nats, weight {1 / (1 + per_round):.1f}: {promoted.sum()} of {n} promoted; "
          f"candidate outcomes to promotion: median {median:.0f}, 90th percentile {p90:.0f} "
          f"(with the baseline's: median {median * (1 + per_round):.0f}, 90th percentile {p90 * (1 + per_round):.0f})")


def test_a_worse_candidate_is_rolled_back() -> None:
    n = 100
    decision, _ = simulate(np.full(n, 0.3), np.ones(n), per_round=1, rounds=10000, seed=3)
    assert (decision == ROLLBACK).mean() >= 0.95 and (decision == PROMOTE).sum() == 0


def test_the_scalar_test_matches_the_vectorised_one() -> None:
    """SequentialTest (the gateway's, one float per outcome) gives the bounds ArmBounds arrays give."""
    rng = np.random.default_rng(2)
    losses = rng.exponential(0.6, size=(2, 400))
    test = SequentialTest(ALPHA, min_outcomes=10)
    arms = ArmBounds(ALPHA, (2,))
    for c, b in losses.T:
        test.add_candidate(c)
        test.add_baseline(b)
        arms.add(scaled(np.array([c, b])))
    assert test.candidate.lower == pytest.approx(arms.lower[0]) and test.baseline.upper == pytest.approx(arms.upper[1])
    reading = test.read()
    assert reading.outcomes == (400, 400) and reading.lower <= 0 <= reading.upper and reading.decision == ""
    assert 0 <= test.candidate.lower <= test.candidate.upper <= 1


def test_min_outcomes_holds_the_decision_back() -> None:
    test = SequentialTest(ALPHA, min_outcomes=300)
    for _ in range(250):
        test.add_candidate(0.05)
        test.add_baseline(2.0)
    assert test.read().decision == "" and test.read().upper < 0     # proven, but too few outcomes yet
    for _ in range(50):
        test.add_candidate(0.05)
        test.add_baseline(2.0)
    assert test.read().decision == PROMOTE
