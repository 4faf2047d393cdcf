"""Online model quality from (served probability, observed answer) pairs, per model and version.

Every pair updates, in Prometheus (labels `model`, `version`; never a learner):

    routerkt_outcomes_total                      pairs recorded
    routerkt_outcome_log_loss_sum / _count       -[y ln p + (1-y) ln(1-p)], p clipped to [EPS, 1-EPS]
    routerkt_outcome_brier_sum / _count          (p - y)^2
    routerkt_outcome_probability_bucket{le}      histogram of the served p (CALIBRATION_BUCKETS)
    routerkt_outcome_correct_total{le}           correct answers among the pairs with p <= le
                                                 (cumulative like the histogram's buckets)

Means: log loss = rate(_sum) / rate(_count). Reliability of bin (a, b]: the difference of
correct_total between le=b and le=a over the difference of the histogram's buckets.

Over a rolling window (`window_s`, kept as `WINDOW_SLOTS` time slots), computed when scraped:

    routerkt_online_auc            AUC estimated from AUC_BINS equal-width probability bins (0.01
                                   wide): pairs of one positive and one negative in the same bin
                                   count 1/2, so the estimate differs from the exact AUC by at most
                                   half the share of such pairs (0 when no two answers share a bin)
    routerkt_online_ece            expected calibration error over the 10 CALIBRATION_BUCKETS bins,
                                   with each bin's mean served probability (exact, not the midpoint)
    routerkt_online_reliability{bin}   observed correct rate per calibration bin ("0.0-0.1", ...)
    routerkt_online_outcomes       pairs inside the window

`totals(model, version)` gives the running (count, log-loss sum) that the canary guardrail reads;
`follow(model, version, fn)` calls fn(log loss) for each later pair of that version (the canary's
sequential test, serving/rollout/sequential.py; fn runs under the lock and must be O(1)).
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram, Summary
from prometheus_client.core import GaugeMetricFamily

EPS = 1e-7
CALIBRATION_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
AUC_BINS = 100
WINDOW_SLOTS = 10


def log_loss(p: float, correct: int) -> float:
    p = min(max(float(p), EPS), 1.0 - EPS)
    return -math.log(p) if correct else -math.log(1.0 - p)


def brier(p: float, correct: int) -> float:
    return (float(p) - correct) ** 2


def calibration_bin(p: float) -> int:
    """Index of the first CALIBRATION_BUCKETS bound >= p (the histogram's own rule)."""
    for i, bound in enumerate(CALIBRATION_BUCKETS):
        if p <= bound:
            return i
    return len(CALIBRATION_BUCKETS) - 1


def auc_from_bins(positives: np.ndarray, negatives: np.ndarray) -> float:
    """AUC from per-bin counts of correct / wrong answers (bins ordered by probability); NaN when
    one class is missing. Ties (one of each class in a bin) count 1/2."""
    pos, neg = np.asarray(positives, dtype=np.float64), np.asarray(negatives, dtype=np.float64)
    n_pos, n_neg = pos.sum(), neg.sum()
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    below = np.concatenate([[0.0], np.cumsum(neg)[:-1]])     # negatives in strictly lower bins
    return float((pos * (below + 0.5 * neg)).sum() / (n_pos * n_neg))


def ece(counts: np.ndarray, correct: np.ndarray, prob_sums: np.ndarray) -> float:
    """Expected calibration error: sum over bins of n_b / n * |mean p_b - correct rate_b|."""
    n = counts.sum()
    if n == 0:
        return float("nan")
    used = counts > 0
    gap = np.abs(prob_sums[used] / counts[used] - correct[used] / counts[used])
    return float((counts[used] / n * gap).sum())


@dataclass
class _Slot:
    start: float
    positives: np.ndarray = field(default_factory=lambda: np.zeros(AUC_BINS, dtype=np.int64))
    negatives: np.ndarray = field(default_factory=lambda: np.zeros(AUC_BINS, dtype=np.int64))
    counts: np.ndarray = field(default_factory=lambda: np.zeros(len(CALIBRATION_BUCKETS), dtype=np.int64))
    correct: np.ndarray = field(default_factory=lambda: np.zeros(len(CALIBRATION_BUCKETS), dtype=np.int64))
    prob_sums: np.ndarray = field(default_factory=lambda: np.zeros(len(CALIBRATION_BUCKETS)))


class RollingWindow:
    """Binned counts of the last `window_s` seconds, in WINDOW_SLOTS slots."""

    def __init__(self, window_s: float, clock=time.monotonic) -> None:
        self.slot_s = window_s / WINDOW_SLOTS
        self.clock = clock
        self.slots: list[_Slot] = []

    def add(self, p: float, correct: int) -> None:
        now = self.clock()
        if not self.slots or now - self.slots[-1].start >= self.slot_s:
            self.slots.append(_Slot(now))
        self._trim(now)
        slot = self.slots[-1]
        auc_bin = min(int(p * AUC_BINS), AUC_BINS - 1)
        (slot.positives if correct else slot.negatives)[auc_bin] += 1
        bucket = calibration_bin(p)
        slot.counts[bucket] += 1
        slot.correct[bucket] += correct
        slot.prob_sums[bucket] += p

    def _trim(self, now: float) -> None:
        horizon = now - self.slot_s * WINDOW_SLOTS
        while self.slots and self.slots[0].start + self.slot_s <= horizon:
            self.slots.pop(0)

    def totals(self) -> _Slot:
        self._trim(self.clock())
        total = _Slot(0.0)
        for slot in self.slots:
            for name in ("positives", "negatives", "counts", "correct", "prob_sums"):
                getattr(total, name)[:] += getattr(slot, name)
        return total


def bin_label(i: int) -> str:
    low = 0.0 if i == 0 else CALIBRATION_BUCKETS[i - 1]
    return f"{low:.1f}-{CALIBRATION_BUCKETS[i]:.1f}"


@dataclass
class _Series:
    """The labelled metric children of one (model, version)."""

    outcomes: object
    log_loss: object
    brier: object
    probability: object
    correct: list            # one counter per CALIBRATION_BUCKETS bound, in order


class OutcomeQuality:
    """The outcome metrics of one gateway (see the module docstring); thread-safe."""

    def __init__(self, registry: CollectorRegistry, window_s: float = 600.0, clock=time.monotonic) -> None:
        labels = ("model", "version")
        self.outcomes = Counter("routerkt_outcomes", "(served probability, observed answer) pairs recorded.",
                                labels, registry=registry)
        self.log_loss = Summary("routerkt_outcome_log_loss", "Log loss of the recorded pairs (natural log; "
                                "p clipped to [1e-7, 1-1e-7]).", labels, registry=registry)
        self.brier = Summary("routerkt_outcome_brier", "Brier score (p - y)^2 of the recorded pairs.", labels,
                             registry=registry)
        self.probability = Histogram("routerkt_outcome_probability", "Served probability of the recorded pairs.",
                                     labels, buckets=CALIBRATION_BUCKETS, registry=registry)
        self.correct = Counter("routerkt_outcome_correct", "Correct answers among the recorded pairs whose "
                               "probability is <= le (cumulative, as the histogram's buckets).",
                               labels + ("le",), registry=registry)
        self.window_s = window_s
        self._clock = clock
        self._windows: dict[tuple[str, str], RollingWindow] = {}
        self._totals: dict[tuple[str, int], list[float]] = {}     # (model, version) -> [count, log-loss sum]
        self._children: dict[tuple[str, str], _Series] = {}
        self._followers: dict[tuple[str, int], list[Callable[[float], None]]] = {}
        self._lock = threading.Lock()
        registry.register(_WindowCollector(self))

    def add_outcome(self, model: str, version: int, p: float, correct: int) -> None:
        p, correct = float(p), int(correct)
        labels = (model, str(version))
        loss = log_loss(p, correct)
        series = self._series(labels)
        series.outcomes.inc()
        series.log_loss.observe(loss)
        series.brier.observe(brier(p, correct))
        series.probability.observe(p)
        if correct:
            for counter in series.correct[calibration_bin(p):]:
                counter.inc()
        with self._lock:
            window = self._windows.get(labels)
            if window is None:
                window = self._windows[labels] = RollingWindow(self.window_s, self._clock)
            window.add(p, correct)
            total = self._totals.setdefault((model, int(version)), [0.0, 0.0])
            total[0] += 1
            total[1] += loss
            for follower in self._followers.get((model, int(version)), ()):
                follower(loss)

    def _series(self, labels: tuple[str, str]) -> _Series:
        """The labelled children of one (model, version), looked up once (every correct{le} bound
        exists from the first pair on, zeros included, like a histogram's buckets)."""
        series = self._children.get(labels)
        if series is None:
            made = _Series(self.outcomes.labels(*labels), self.log_loss.labels(*labels),
                           self.brier.labels(*labels), self.probability.labels(*labels),
                           [self.correct.labels(*labels, _le(bound)) for bound in CALIBRATION_BUCKETS])
            with self._lock:
                series = self._children.setdefault(labels, made)
        return series

    def totals(self, model: str, version: int) -> tuple[int, float]:
        """(pairs recorded, their log-loss sum) since the gateway started."""
        with self._lock:
            count, loss = self._totals.get((model, int(version)), (0.0, 0.0))
        return int(count), loss

    def follow(self, model: str, version: int, fn: Callable[[float], None]) -> None:
        """Call fn(log loss) for every pair of (model, version) recorded from now on."""
        with self._lock:
            self._followers.setdefault((model, int(version)), []).append(fn)

    def unfollow(self, model: str, version: int, fn: Callable[[float], None]) -> None:
        with self._lock:
            followers = self._followers.get((model, int(version)), [])
            if fn in followers:
                followers.remove(fn)
            if not followers:
                self._followers.pop((model, int(version)), None)

    def summary(self) -> dict[str, dict[str, float]]:
        """Per "model/version": outcomes, mean log loss, online AUC (for /v1/rollout and the CLI)."""
        out = {}
        with self._lock:
            items = list(self._windows.items())
            totals = dict(self._totals)
        for (model, version), window in items:
            count, loss = totals.get((model, int(version)), (0.0, 0.0))
            recent = window.totals()
            out[f"{model}/{version}"] = {"outcomes": int(count), "mean_log_loss": loss / count if count else None,
                                         "online_auc": _finite(auc_from_bins(recent.positives, recent.negatives)),
                                         "online_outcomes": int(recent.counts.sum())}
        return out

    def windows(self) -> list[tuple[tuple[str, str], _Slot]]:
        with self._lock:
            return [(labels, window.totals()) for labels, window in self._windows.items()]


def _le(bound: float) -> str:
    return f"{bound:g}" if bound != 1.0 else "1.0"


def _finite(x: float) -> float | None:
    return None if math.isnan(x) else x


class _WindowCollector:
    """Computes the rolling-window gauges when Prometheus scrapes."""

    def __init__(self, quality: OutcomeQuality) -> None:
        self.quality = quality

    def describe(self):
        return []

    def collect(self):
        auc = GaugeMetricFamily("routerkt_online_auc", "AUC over the rolling window, from 0.01-wide probability "
                                "bins (ties within a bin count 1/2).", labels=["model", "version"])
        ece_g = GaugeMetricFamily("routerkt_online_ece", "Expected calibration error over the rolling window "
                                  "(10 bins).", labels=["model", "version"])
        reliability = GaugeMetricFamily("routerkt_online_reliability", "Observed correct rate per calibration "
                                        "bin over the rolling window.", labels=["model", "version", "bin"])
        count = GaugeMetricFamily("routerkt_online_outcomes", "Pairs inside the rolling window.",
                                  labels=["model", "version"])
        for (model, version), t in self.quality.windows():
            labels = [model, version]
            count.add_metric(labels, float(t.counts.sum()))
            value = auc_from_bins(t.positives, t.negatives)
            if not math.isnan(value):
                auc.add_metric(labels, value)
            value = ece(t.counts, t.correct, t.prob_sums)
            if not math.isnan(value):
                ece_g.add_metric(labels, value)
            for i in np.flatnonzero(t.counts):
                reliability.add_metric(labels + [bin_label(int(i))], float(t.correct[i] / t.counts[i]))
        yield from (auc, ece_g, reliability, count)
