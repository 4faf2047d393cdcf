"""Analysis helpers: history-only (prefix) scoring, attention maps and routing weights of chosen
learners, and the similarity of attention patterns (Spearman correlation, SSIM) between methods and
between the heads of one model, as in the RouterKT paper's diversity analysis."""
from __future__ import annotations

import itertools

import numpy as np
import torch
from scipy.ndimage import uniform_filter
from scipy.stats import spearmanr

from routerkt.contract.signature import CANDIDATE_RESPONSE, PAD_ID
from training.data.protocol import Sequences
from training.models.kt_model import KTModel


def prefix_windows(seqs: Sequences) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every real position t of every window as its own window ending at t (left-padded, same width),
    laid out as the gateway sends a candidate: the response at t (the label) is replaced by
    CANDIDATE_RESPONSE, so even a leaking model cannot read it. Returns (questions, skills [N, W, K],
    responses, labels) with one row per scored position."""
    W = seqs.questions.shape[1]
    rows, cols = np.nonzero(seqs.responses >= 0)                         # scored positions
    shift = (W - 1 - cols)[:, None]                                      # move column c to W-1
    src = np.arange(W)[None, :] - shift                                  # [N, W]
    ok = src >= 0
    src = np.clip(src, 0, W - 1)

    def pick(a: np.ndarray, fill: int) -> np.ndarray:
        mask = ok.reshape(ok.shape + (1,) * (a.ndim - 2))                # skill sets keep their last axis
        return np.where(mask, a[rows[:, None], src], fill)

    responses = pick(seqs.responses, -1)
    responses[:, -1] = CANDIDATE_RESPONSE                                # the label is not an input
    return pick(seqs.questions, PAD_ID), pick(seqs.skills, PAD_ID), responses, seqs.responses[rows, cols]


@torch.inference_mode()
def prefix_predictions(model: KTModel, seqs: Sequences, batch_size: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """Labels and probabilities when each position only sees its own prefix (what a server sees)."""
    model.eval()
    q, s, r, labels = prefix_windows(seqs)
    probs = []
    for i in range(0, len(labels), batch_size):
        batch = slice(i, i + batch_size)
        width = int((r[batch] >= 0).sum(1).max())                      # the candidate slot holds 0
        cols = slice(q.shape[1] - width, None)
        logits = model(torch.from_numpy(q[batch, cols]), torch.from_numpy(s[batch, cols]),
                       torch.from_numpy(r[batch, cols])).logits[:, -1]
        probs.append(torch.sigmoid(logits).numpy())
    return labels, (np.concatenate(probs) if probs else np.zeros(0))


@torch.inference_mode()
def attention_and_routing(model: KTModel, seqs: Sequences,
                          rows: np.ndarray) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """{layer name: [n, H, L, L]} attention maps and per routed layer [n, L, E] weights for `rows`,
    trimmed to the longest of the chosen learners."""
    model.eval()
    width = int(seqs.lengths[rows].max())
    cols = slice(seqs.questions.shape[1] - width, None)
    out = model(torch.from_numpy(seqs.questions[rows, cols]), torch.from_numpy(seqs.skills[rows, cols]),
                torch.from_numpy(seqs.responses[rows, cols]), return_attention=True, return_routing=True)
    maps = {name: a.float().numpy() for name, a in zip(out.attention_names or [], out.attention or [])}
    return maps, [w.float().numpy() for w in (out.routing or [])]


def ssim(a: np.ndarray, b: np.ndarray, window: int = 7, data_range: float = 1.0) -> float:
    """Mean structural similarity of two 2-D maps (uniform window, the usual constants)."""
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    a, b = a.astype(np.float64), b.astype(np.float64)
    size = min(window, *a.shape)
    mu_a, mu_b = uniform_filter(a, size), uniform_filter(b, size)
    var_a = uniform_filter(a * a, size) - mu_a ** 2
    var_b = uniform_filter(b * b, size) - mu_b ** 2
    cov = uniform_filter(a * b, size) - mu_a * mu_b
    similarity = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a ** 2 + mu_b ** 2 + c1) * (var_a + var_b + c2))
    return float(similarity.mean())


def spearman(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    """Spearman correlation of the visible entries of two maps (NaN if either is constant)."""
    x, y = a[mask], b[mask]
    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(spearmanr(x, y).statistic)


def visible_mask(length: int, past: bool = True) -> np.ndarray:
    """Entries a retriever query can see: j < i (strictly past)."""
    return np.tril(np.ones((length, length), dtype=bool), -1 if past else 0)


def pairwise_similarity(maps: dict[str, list[np.ndarray]]) -> dict[tuple[str, str], dict[str, float]]:
    """Mean Spearman / SSIM between methods: maps[method] is one [L_i, L_i] map per learner (the
    same learners in the same order for every method)."""
    out = {}
    for first, second in itertools.combinations(maps, 2):
        spearmans, ssims = [], []
        for a, b in zip(maps[first], maps[second]):
            mask = visible_mask(a.shape[0])
            spearmans.append(spearman(a, b, mask))
            ssims.append(ssim(a, b))
        out[(first, second)] = {"spearman": float(np.nanmean(spearmans)), "ssim": float(np.mean(ssims)),
                                "n": len(spearmans)}
    return out


def head_similarity(per_learner_heads: list[np.ndarray]) -> dict[str, float]:
    """Mean Spearman / SSIM between the heads of one model ([H, L, L] per learner): lower = more diverse heads."""
    spearmans, ssims = [], []
    for heads in per_learner_heads:
        mask = visible_mask(heads.shape[-1])
        for i, j in itertools.combinations(range(heads.shape[0]), 2):
            spearmans.append(spearman(heads[i], heads[j], mask))
            ssims.append(ssim(heads[i], heads[j]))
    return {"spearman": float(np.nanmean(spearmans)) if spearmans else float("nan"),
            "ssim": float(np.mean(ssims)) if ssims else float("nan")}
