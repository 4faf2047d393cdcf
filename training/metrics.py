"""Evaluation metrics over scored positions: AUC (rank-based, ties averaged), accuracy at 0.5 and
RMSE of the probabilities, plus mean/std aggregation over folds."""
from __future__ import annotations

import numpy as np
from scipy.stats import rankdata


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U); NaN when only one class is present."""
    labels = np.asarray(labels).astype(bool)
    n_pos = int(labels.sum())
    n_neg = labels.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(np.asarray(scores, dtype=np.float64))
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def summarize(labels: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    labels = np.asarray(labels, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    return {
        "auc": auc(labels, probs),
        "acc": float(((probs >= 0.5) == (labels >= 0.5)).mean()) if labels.size else float("nan"),
        "rmse": float(np.sqrt(np.mean((probs - labels) ** 2))) if labels.size else float("nan"),
        "n": int(labels.size),
    }


def aggregate(per_fold: list[dict[str, float]], keys=("auc", "acc", "rmse")) -> dict[str, dict]:
    """{"auc": {"mean", "std" (population, as the reference code), "folds": [...]}, ...}"""
    out: dict[str, dict] = {}
    for key in keys:
        values = [float(m[key]) for m in per_fold]
        out[key] = {"mean": float(np.mean(values)), "std": float(np.std(values)), "folds": values}
    return out
