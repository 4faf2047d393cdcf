"""`routerkt evaluate`: score a run's checkpoint on a dataset and write plots.

Writes OUT/eval.json (AUC/ACC/RMSE over every real position of every window; with --history-only
also each position scored from its own prefix) and PNG plots beside their JSON data: training
curves, attention heatmaps per head of the last knowledge-retriever layer for a few learners, and
the router's head usage (routed models).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", required=True, help="training run directory")
    p.add_argument("--data", required=True, help="canonical CSV to evaluate on (ids mapped with the run's vocabulary)")
    p.add_argument("--fold", type=int, default=None, help="fold checkpoint (default: best validation AUC)")
    p.add_argument("--out", default=None, help="output directory (default: RUN/eval)")
    p.add_argument("--learners", type=int, default=3, help="learners to draw attention heatmaps for")
    p.add_argument("--history-only", action="store_true", help="also score each position from its own prefix")
    p.add_argument("--batch-size", type=int, default=512)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from routerkt.errors import UserError
    from training import plots
    from training.eval.analysis import attention_and_routing, prefix_predictions
    from routerkt.atomic import atomic_write_json
    from training.checkpoint import load_checkpoint
    from training.data.pipeline import load_sequences
    from training.fold_training import evaluate
    from training.metrics import summarize
    from training.training_run import best_fold_dir

    run_dir = Path(args.run)
    if not run_dir.is_dir():
        raise UserError(f"--run {run_dir}: not a directory")
    fold_dir = run_dir / f"fold-{args.fold}" if args.fold is not None else best_fold_dir(run_dir)
    ckpt = load_checkpoint(fold_dir)
    _, seqs = load_sequences(dataclasses.replace(ckpt.config.data, path=str(args.data)), ckpt.vocab)
    out = Path(args.out) if args.out else run_dir / "eval"
    result = {"checkpoint": str(fold_dir), "data": str(args.data), "sequences": len(seqs),
              "metrics": evaluate(ckpt.model, seqs, args.batch_size)}
    if args.history_only:
        result["history_only"] = summarize(*prefix_predictions(ckpt.model, seqs, args.batch_size))
    atomic_write_json(out / "eval.json", result)

    written = [plots.training_curves(run_dir)]
    rng = np.random.default_rng(0)
    rows = rng.choice(len(seqs), size=min(args.learners, len(seqs)), replace=False)
    for k, row in enumerate(rows):
        maps, _ = attention_and_routing(ckpt.model, seqs, np.array([row]))
        retrievers = [name for name in maps if name.startswith("retriever")]
        if retrievers:
            name = retrievers[-1]
            written.append(plots.attention_heatmaps(maps[name][0], f"{ckpt.config.preset}: {name}, learner sample {k}",
                                                    out / f"attention_learner{k}.png"))
    sample = np.arange(min(len(seqs), 256))
    _, routing = attention_and_routing(ckpt.model, seqs, sample)
    if routing:
        width = routing[0].shape[1]
        valid = seqs.responses[sample][:, -width:] >= 0
        written.append(plots.router_usage(routing, valid, out / "router_usage.png",
                                          f"{ckpt.config.preset}: mean routing weight per head"))
    metrics = result["metrics"]
    print(json.dumps({"eval": str(out / "eval.json"), "auc": round(metrics["auc"], 4), "acc": round(metrics["acc"], 4),
                      "rmse": round(metrics["rmse"], 4), "plots": [str(p) for p in written if p]}))
    return 0
