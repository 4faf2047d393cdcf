"""The served protocol beside the paper's: every test answer predicted from what the server holds just before it.

- paper: each test learner's last W interactions (data.protocol=recent), every position predicted from its
  prefix inside them (what results/ tables report, and what a run's result.json holds for a window model);
- served: every answer of every test learner, in order, predicted as the server predicts it: a window
  model from the last W - 1 answers before it (the first W answers from their prefix, exactly as the
  server does below the window; every later answer from its own window [t - W + 1, t]); a band model
  from the whole history before it (one forward over the whole history: training/models/band.py,
  the function of the server's rolling state). `slid` is the part of it whose window has slid (answers
  t >= W, 0-based: more than W - 1 answers before them), where the two kinds of model differ.
Cached per run in RUN/protocols.json (keyed by the finished folds and this scoring).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch

from training.config import Protocol
from training.data.protocol import Sequences
from training.metrics import aggregate, summarize

SCORING = "served v1: window = last W - 1 before each answer; band = whole history"
CACHE = "protocols.json"
KEYS = ("auc", "acc", "rmse", "logloss")


def log_loss(labels: np.ndarray, probs: np.ndarray) -> float:
    p = np.clip(np.asarray(probs, dtype=np.float64), 1e-7, 1 - 1e-7)
    y = np.asarray(labels, dtype=np.float64)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))) if y.size else float("nan")


def scores(labels: np.ndarray, probs: np.ndarray) -> dict:
    return {**summarize(labels, probs), "logloss": log_loss(labels, probs)}


@torch.inference_mode()
def _forward(model, questions: np.ndarray, skills: np.ndarray, responses: np.ndarray) -> np.ndarray:
    """Probabilities [B, L] of a left-padded batch (float32, as served)."""
    logits = model(torch.from_numpy(questions), torch.from_numpy(skills), torch.from_numpy(responses)).logits
    return torch.sigmoid(logits.float()).numpy()


def _batches(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Row indices in batches of similar length (scoring only: no prediction depends on the batch)."""
    order = np.argsort(-lengths, kind="stable")
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def _trimmed(seqs: Sequences, rows: np.ndarray) -> tuple[np.ndarray, ...]:
    width = max(int(seqs.lengths[rows].max()), 1)
    return seqs.questions[rows, -width:], seqs.skills[rows, -width:], seqs.responses[rows, -width:]


def band_served(model, whole: Sequences, batch_size: int = 64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(labels, probs, answer index t) of every answer of `whole` (data.protocol=whole), whole histories."""
    labels, probs, index = [], [], []
    for rows in _batches(whole.lengths, batch_size):
        q, s, r = _trimmed(whole, rows)
        p = _forward(model, q, s, r)
        width = q.shape[1]
        scored = r >= 0
        labels.append(r[scored])
        probs.append(p[scored])
        index.append((np.arange(width)[None, :] - (width - whole.lengths[rows])[:, None])[scored])
    return np.concatenate(labels), np.concatenate(probs), np.concatenate(index)


def window_served(model, whole: Sequences, window: int,
                  batch_size: int = 512) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(labels, probs, answer index t) of every answer of `whole` as a window-W model is served: answers
    t < W from the learner's first W (their prefixes), each later answer from the window ending at it."""
    S, width = whole.questions.shape
    n = whole.lengths
    start = width - n                                                        # column of answer 0
    labels, probs, index = [], [], []
    first = np.minimum(n, window)                                            # the first windows
    cols = start[:, None] + np.arange(window)[None, :] - (window - first)[:, None]   # [S, W], left-padded
    pad = np.arange(window)[None, :] < (window - first)[:, None]
    cols = np.where(pad, 0, cols)
    rows = np.arange(S)[:, None]
    q = np.where(pad, 0, whole.questions[rows, cols])
    s = np.where(pad[..., None], 0, whole.skills[rows, cols])
    r = np.where(pad, -1, whole.responses[rows, cols])
    for batch in _batches(first, batch_size):
        w = max(int(first[batch].max()), 1)
        p = _forward(model, q[batch, -w:], s[batch, -w:], r[batch, -w:])
        scored = r[batch, -w:] >= 0
        labels.append(r[batch, -w:][scored])
        probs.append(p[scored])
        index.append((np.arange(w)[None, :] - (w - first[batch])[:, None])[scored])
    owner = np.repeat(np.arange(S), np.maximum(n - window, 0))              # answers t >= W: one window each
    t = np.concatenate([np.arange(window, k) for k in n]) if owner.size else np.zeros(0, dtype=np.int64)
    for i in range(0, owner.size, batch_size):
        o, tt = owner[i:i + batch_size], t[i:i + batch_size]
        c = (start[o] + tt)[:, None] - np.arange(window - 1, -1, -1)[None, :]    # [b, W], the last = t
        p = _forward(model, whole.questions[o[:, None], c], whole.skills[o[:, None], c], whole.responses[o[:, None], c])
        labels.append(whole.responses[o, start[o] + tt])
        probs.append(p[:, -1])
        index.append(tt)
    return np.concatenate(labels), np.concatenate(probs), np.concatenate(index)


def served(model, whole: Sequences, batch_size: int = 512) -> dict:
    """The served protocol's scores of `model` on `whole`: all answers, and those past the window."""
    window = model.config.max_len
    if model.config.band:
        labels, probs, t = band_served(model, whole, max(batch_size // 8, 1))
    else:
        labels, probs, t = window_served(model, whole, window, batch_size)
    slid = t >= window
    return {"all": scores(labels, probs), "slid": scores(labels[slid], probs[slid]),
            "slid_share": float(slid.mean()) if slid.size else 0.0}


def _finished(run: Path) -> list[Path]:
    return [d for d in sorted(run.glob("fold-*")) if (d / "result.json").exists()]


def fold_protocols(fold_dir: Path, test: np.ndarray) -> dict:
    """Paper and served scores of one fold checkpoint on its test learners `test` (raw ids)."""
    from training.checkpoint import load_checkpoint
    from training.data.pipeline import load_sequences
    ckpt = load_checkpoint(fold_dir)
    model = ckpt.model.eval()
    data = ckpt.config.data
    recent = dataclasses.replace(data, protocol=Protocol.RECENT, window=model.config.max_len)
    whole = dataclasses.replace(data, protocol=Protocol.WHOLE)
    _, paper_seqs = load_sequences(recent, ckpt.vocab)
    _, whole_seqs = load_sequences(whole, ckpt.vocab)
    paper_seqs, whole_seqs = paper_seqs.select_learners(test), whole_seqs.select_learners(test)
    labels, probs = [], []
    for rows in _batches(paper_seqs.lengths, 512):
        q, s, r = _trimmed(paper_seqs, rows)
        p = _forward(model, q, s, r)
        labels.append(r[r >= 0])
        probs.append(p[r >= 0])
    return {"fold": int(ckpt.meta["fold"]), "paper": scores(np.concatenate(labels), np.concatenate(probs)),
            "served": served(model, whole_seqs)}


def protocols(run: Path) -> dict:
    """Paper and served scores of every finished fold of a run (cached in RUN/protocols.json)."""
    from routerkt.atomic import atomic_write_json
    run = Path(run)
    finished = _finished(run)
    key = {"scoring": SCORING, "scored_folds": [d.name for d in finished]}
    cache = run / CACHE
    if cache.exists():
        cached = json.loads(cache.read_text())
        if all(cached.get(k) == v for k, v in key.items()):
            return cached
    tests = {f["fold"]: np.asarray(f["test"], dtype=np.int64) for f in json.loads((run / "folds.json").read_text())}
    folds = []
    for fold_dir in finished:
        fold = int(fold_dir.name.split("-")[1])
        folds.append(fold_protocols(fold_dir, tests[fold]))
    out = {**key, "folds": folds}
    if folds:
        out["paper"] = aggregate([f["paper"] for f in folds], KEYS)
        out["served"] = aggregate([f["served"]["all"] for f in folds], KEYS)
        out["served_slid"] = aggregate([f["served"]["slid"] for f in folds], KEYS)
    atomic_write_json(cache, out)
    return out


BAND = "+context=band"         # a variant folder's band version (training/paper/variants.py)


def _cell(stats: dict | None, key: str = "auc") -> str:
    if not stats:
        return "-"
    return f"{stats[key]['mean']:.4f}"


def _paired(window: dict, band: dict, part: str) -> str:
    """Mean and per-fold band - window AUC of the folds both runs finished (same folds and seeds)."""
    w = {f["fold"]: f for f in window.get("folds", [])}
    pairs = [(b, w[b["fold"]]) for b in band.get("folds", []) if b["fold"] in w]
    if not pairs:
        return "-"

    def auc(f: dict) -> float:
        return f["paper"]["auc"] if part == "paper" else f["served"]["all" if part == "served" else "slid"]["auc"]
    diffs = [auc(b) - auc(wf) for b, wf in pairs]
    return f"{np.mean(diffs):+.4f} ({', '.join(f'{d:+.4f}' for d in diffs)})"


def write_table(out: Path) -> Path:
    """OUT/PROTOCOLS.md: paper and served protocol of every run under OUT/<dataset>/<variant>/ (computed and
    cached per run), and each window variant against its band version, fold by fold."""
    out = Path(out)
    rows, pairs = [], []
    for run in sorted(p.parent for p in out.glob("*/*/folds.json")):
        if not _finished(run):
            continue
        table = protocols(run)
        dataset, variant = run.parent.name, run.name
        first = table["folds"][0]["served"]
        rows.append(f"| {dataset} | {variant} | {len(table['folds'])} | {_cell(table.get('paper'))} | "
                    f"{_cell(table.get('served'))} | {_cell(table.get('served_slid'))} | "
                    f"{_cell(table.get('served'), 'logloss')} | {first['all']['n']:,} | {first['slid_share']:.0%} |")
        if variant.endswith(BAND) and (run.parent / variant[:-len(BAND)] / CACHE).exists():
            window = json.loads((run.parent / variant[:-len(BAND)] / CACHE).read_text())
            pairs.append(f"| {dataset} | {variant[:-len(BAND)]} | {_paired(window, table, 'served')} | "
                         f"{_paired(window, table, 'slid')} | {_paired(window, table, 'paper')} |")
    lines = ["# Window and band models: the paper's protocol and the served one", "",
             "Written by `routerkt reproduce --out OUT --protocols` (training/eval/served_protocol.py). AUC means over the",
             "finished folds. paper: each test learner's last W answers, each from its prefix inside them. served:",
             "every answer of every test learner from what the server holds before it (window: the last W - 1; band:",
             "the whole history); slid: the served answers with more than W - 1 before them. n and slid share: fold 0.",
             "", "| dataset | variant | folds | paper AUC | served AUC | served AUC, slid | served log loss | "
             "served n | slid share |", "|---|---|---|---|---|---|---|---|---|", *rows, "",
             "Band minus window, paired by fold (same folds, same seeds): mean (per fold).", "",
             "| dataset | preset | served AUC | served AUC, slid | paper AUC |", "|---|---|---|---|---|", *pairs, ""]
    path = out / "PROTOCOLS.md"
    path.write_text("\n".join(lines))
    return path
