"""serving/metrics/quality.py: the outcome metrics equal an offline computation over the same
pairs, the binned AUC estimate is within its documented bound of the exact AUC, and the rolling
window forgets old pairs."""
from __future__ import annotations

import math

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from serving.metrics.quality import (AUC_BINS, CALIBRATION_BUCKETS, OutcomeQuality, auc_from_bins, ece,
                                      log_loss)

pytestmark = pytest.mark.unit


def exact_auc(p: np.ndarray, y: np.ndarray) -> float:
    pos, neg = p[y == 1], p[y == 0]
    greater = (pos[:, None] > neg[None, :]).sum()
    ties = (pos[:, None] == neg[None, :]).sum()
    return float((greater + 0.5 * ties) / (len(pos) * len(neg)))


def sample(registry: CollectorRegistry, name: str, **labels) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_counters_equal_the_offline_computation() -> None:
    rng = np.random.default_rng(0)
    p = rng.uniform(0, 1, 2000).astype(np.float32).astype(np.float64)
    y = (rng.uniform(0, 1, 2000) < p).astype(int)
    registry = CollectorRegistry()
    quality = OutcomeQuality(registry)
    for pi, yi in zip(p, y):
        quality.add_outcome("kt", 3, pi, yi)
    labels = {"model": "kt", "version": "3"}
    clipped = np.clip(p, 1e-7, 1 - 1e-7)
    offline_ll = -(y * np.log(clipped) + (1 - y) * np.log(1 - clipped)).sum()
    assert sample(registry, "routerkt_outcomes_total", **labels) == 2000
    assert sample(registry, "routerkt_outcome_log_loss_sum", **labels) == pytest.approx(offline_ll, abs=1e-6)
    assert sample(registry, "routerkt_outcome_log_loss_count", **labels) == 2000
    assert sample(registry, "routerkt_outcome_brier_sum", **labels) == pytest.approx(((p - y) ** 2).sum(), abs=1e-6)
    for bound in CALIBRATION_BUCKETS:
        le = f"{bound:g}" if bound != 1.0 else "1.0"
        assert sample(registry, "routerkt_outcome_probability_bucket", **labels, le=le) == (p <= bound).sum()
        assert sample(registry, "routerkt_outcome_correct_total", **labels, le=le) == ((p <= bound) & (y == 1)).sum()
    assert quality.totals("kt", 3) == (2000, pytest.approx(offline_ll, abs=1e-6))


def test_log_loss_is_finite_at_the_extremes() -> None:
    assert math.isfinite(log_loss(0.0, 1)) and math.isfinite(log_loss(1.0, 0))
    assert log_loss(1.0, 1) == pytest.approx(0.0, abs=1e-6)


def test_binned_auc_is_exact_when_each_bin_holds_one_probability() -> None:
    rng = np.random.default_rng(1)
    p = (rng.integers(0, AUC_BINS, 3000) + 0.5) / AUC_BINS
    y = (rng.uniform(0, 1, 3000) < p).astype(int)
    bins = np.minimum((p * AUC_BINS).astype(int), AUC_BINS - 1)
    pos, neg = np.bincount(bins[y == 1], minlength=AUC_BINS), np.bincount(bins[y == 0], minlength=AUC_BINS)
    assert auc_from_bins(pos, neg) == pytest.approx(exact_auc(p, y), abs=1e-12)


def test_binned_auc_is_within_half_the_share_of_same_bin_pairs() -> None:
    rng = np.random.default_rng(2)
    p = rng.beta(2, 2, 3000)
    y = (rng.uniform(0, 1, 3000) < p).astype(int)
    bins = np.minimum((p * AUC_BINS).astype(int), AUC_BINS - 1)
    pos, neg = np.bincount(bins[y == 1], minlength=AUC_BINS), np.bincount(bins[y == 0], minlength=AUC_BINS)
    bound = 0.5 * (pos * neg).sum() / (pos.sum() * neg.sum())
    assert abs(auc_from_bins(pos, neg) - exact_auc(p, y)) <= bound
    assert bound < 0.01


def test_ece_uses_each_bins_mean_probability() -> None:
    counts, correct, sums = np.array([2, 0, 4]), np.array([1, 0, 4]), np.array([0.2, 0.0, 3.6])
    assert ece(counts, correct, sums) == pytest.approx(2 / 6 * abs(0.1 - 0.5) + 4 / 6 * abs(0.9 - 1.0))


def test_window_gauges_follow_the_recent_pairs_only() -> None:
    now = [0.0]
    registry = CollectorRegistry()
    quality = OutcomeQuality(registry, window_s=100.0, clock=lambda: now[0])
    for p, y in [(0.9, 1), (0.8, 1), (0.2, 0), (0.3, 1)]:
        quality.add_outcome("kt", 1, p, y)
    assert registry.get_sample_value("routerkt_online_outcomes", {"model": "kt", "version": "1"}) == 4
    assert registry.get_sample_value("routerkt_online_auc", {"model": "kt", "version": "1"}) == pytest.approx(1.0)
    assert registry.get_sample_value("routerkt_online_reliability",
                                     {"model": "kt", "version": "1", "bin": "0.2-0.3"}) == 1.0
    now[0] = 150.0                                    # the old slot left the window
    quality.add_outcome("kt", 1, 0.9, 0)
    quality.add_outcome("kt", 1, 0.1, 1)
    assert registry.get_sample_value("routerkt_online_outcomes", {"model": "kt", "version": "1"}) == 2
    assert registry.get_sample_value("routerkt_online_auc", {"model": "kt", "version": "1"}) == pytest.approx(0.0)
    assert quality.totals("kt", 1)[0] == 6            # the running totals keep everything
