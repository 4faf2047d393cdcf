"""The history-only score of a finished run, for the leaking whole-window routing: every fold's
test set scored with each position predicted from its own prefix, its answer hidden (what a server
can actually see). Cached in RUN/history_only.json with the scoring and the folds it covers, so a
cache from an older scoring or from fewer folds is recomputed rather than reported.
"""
from __future__ import annotations

import json
from pathlib import Path

# Caches written by an older scoring (which left the label in the last window slot) are recomputed.
HISTORY_SCORING = "prefix, label hidden"
CACHE = "history_only.json"


def _finished_folds(run: Path) -> list[Path]:
    return [d for d in sorted(run.glob("fold-*")) if (d / "result.json").exists()]


def _history_key(finished: list[Path]) -> dict:
    return {"scoring": HISTORY_SCORING, "scored_folds": [d.name for d in finished]}


def cached_history_only(run: Path) -> dict | None:
    """The run's history-only score if its cache is current (this scoring, these finished folds)."""
    cache = run / CACHE
    if not cache.exists():
        return None
    cached = json.loads(cache.read_text())
    key = _history_key(_finished_folds(run))
    return cached if all(cached.get(k) == v for k, v in key.items()) else None


def history_only(run: Path) -> dict:
    """Score every finished fold's test set from prefixes only; cached in the run."""
    from routerkt.atomic import atomic_write_json
    from training.eval.analysis import prefix_predictions
    from training.checkpoint import load_checkpoint
    from training.metrics import aggregate, summarize
    from training.training_run import prepare
    if (cached := cached_history_only(run)) is not None:
        return cached
    finished = _finished_folds(run)
    per_fold, seqs, folds = [], None, None
    for fold_dir in finished:
        ckpt = load_checkpoint(fold_dir)
        if seqs is None:                      # the folds of one run share their data and split: read once
            _, _, seqs, folds = prepare(ckpt.config)
        fold = next(f for f in folds if f.index == ckpt.meta["fold"])
        labels, probs = prefix_predictions(ckpt.model, seqs.select_learners(fold.test), 512)
        per_fold.append(summarize(labels, probs))
    out = {**aggregate(per_fold), **_history_key(finished)} if per_fold else {}
    atomic_write_json(run / CACHE, out)
    return out
