"""`routerkt train`: train a preset on a canonical CSV with K-fold cross-validation.

Example:
    routerkt train --data ../shared/datasets/assist2009/interactions.csv.gz --preset routerkt-akt --folds 1 --epochs 3
Data-parallel (training/launch.py): add --nproc N, or run under torchrun with --out:
    torchrun --nproc-per-node 2 -m routerkt.cli train --data ... --preset routerkt-akt --out runs/x
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from routerkt.errors import UserError
from training.config import RunConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True,
                   help="canonical CSV user_id,order,question_id,skill_id,correct (.csv or .csv.gz)")
    p.add_argument("--preset", required=True, help="model preset, e.g. routerkt-akt, akt, alibi-akt, dkt")
    p.add_argument("--folds", type=int, default=5,
                   help="K of K-fold cross-validation over learners (1 = one 80/20 split)")
    p.add_argument("--epochs", type=int, default=None, help="maximum epochs per fold (default 300, early stopping)")
    p.add_argument("--out", default=None,
                   help="run directory (default runs/<preset>-<timestamp>); an existing run resumes")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config field, e.g. model.n_selected=4, train.lr=3e-4, data.protocol=chunks")
    p.add_argument("--folds-file", default=None, help="JSON {fold: [learner ids]} giving each fold's test learners")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="data-parallel training processes on this host (DDP, gloo); the global batch stays "
                        "train.batch_size, split across them (default 1)")


def build_config(args: argparse.Namespace) -> RunConfig:
    from training.models.registry import run_config
    options = [f"data.folds={args.folds}"]
    if args.folds_file:
        options.append(f"data.folds_file={args.folds_file}")
    if args.epochs is not None:
        options.append(f"train.epochs={args.epochs}")
    cfg = run_config(args.preset, args.data, options + args.overrides)      # --set comes last and wins
    if cfg.train.epochs < 1:
        raise UserError("--epochs must be >= 1")
    if cfg.data.folds < 1:
        raise UserError("--folds must be >= 1")
    if not Path(cfg.data.path).is_file():
        raise UserError(f"--data {cfg.data.path}: no such file")
    return cfg


def run(args: argparse.Namespace) -> int:
    cfg = build_config(args)
    from training import launch as launcher
    from training.distributed import from_env
    under_torchrun = from_env() is not None
    if under_torchrun and not args.out:
        raise UserError("under torchrun give --out: every process must name the same run directory")
    out = Path(args.out or f"runs/{args.preset}-{time.strftime('%Y%m%d-%H%M%S')}")
    metrics = launcher.train(cfg, out, args.nproc, progress=not args.no_progress and sys.stderr.isatty())
    if metrics is None:                      # a torchrun rank other than 0: rank 0 reports
        return 0
    summary = {k: {"mean": round(metrics[k]["mean"], 4), "std": round(metrics[k]["std"], 4)}
               for k in ("auc", "acc", "rmse")}
    print(json.dumps({"run": str(out), **summary}))
    return 0
