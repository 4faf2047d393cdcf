"""`routerkt bench distributed`: data-parallel training throughput (sequences per second), 1 vs N processes.

The process counts (training/launch.py) run in one invocation, on the same data and config.

Each process count trains a fresh run (fold 0 of a single 80/20 split, --epochs epochs) through the
same launcher as `routerkt train --nproc N`: the global batch is train.batch_size in every case and
the cores are shared (train.threads = cores / N unless --set train.threads=...). The throughput is
rank 0's training sequences per second (history train_seq_per_s: optimizer steps only, no process
start, validation or test), the median over the epochs after the first (the first warms up); the
wall time of the whole run is printed beside it. --out writes the numbers as JSON.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="routerkt-akt")
    p.add_argument("--data", default=None, help="canonical CSV (default: a synthetic dataset of --learners learners)")
    p.add_argument("--learners", type=int, default=2000, help="learners of the synthetic dataset")
    p.add_argument("--nprocs", default="1,2", help="comma-separated process counts (default 1,2)")
    p.add_argument("--epochs", type=int, default=3,
                   help="epochs per run (the first is not counted when there are more)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="config override for every run, e.g. train.batch_size=128")
    p.add_argument("--out", default=None, help="write the results as JSON here")


def run(args: argparse.Namespace) -> int:
    from routerkt.errors import UserError
    from training import launch as launcher
    from training.models.registry import run_config

    try:
        counts = [int(n) for n in args.nprocs.split(",") if n.strip()]
    except ValueError:
        raise UserError(f"--nprocs {args.nprocs!r}: expected comma-separated integers") from None
    if not counts or min(counts) < 1:
        raise UserError("--nprocs: process counts must be >= 1")
    if args.epochs < 1:
        raise UserError("--epochs must be >= 1")
    work = Path(tempfile.mkdtemp(prefix="routerkt-bench-dist-"))
    try:
        data = args.data
        if data is None:
            from training.data.synthetic import generate, write_csv
            data = str(work / "synthetic.csv")
            write_csv(generate(n_learners=args.learners, seed=7), data)
        cfg = run_config(args.preset, data, ["data.folds=1", f"train.epochs={args.epochs}", *args.overrides])
        rows = []
        for n in counts:
            started = time.perf_counter()
            launcher.launch(cfg, work / f"run-{n}", n, progress=False)
            wall = time.perf_counter() - started
            history = json.loads((work / f"run-{n}" / "fold-0" / "history.json").read_text())
            rates = [h["train_seq_per_s"] for h in history]
            counted = rates[1:] or rates
            rows.append({"nproc": n, "seq_per_s": statistics.median(counted), "epochs": rates, "wall_seconds": wall})
            epochs = ", ".join(f"{r:.0f}" for r in rates)
            print(f"{n} process(es): {rows[-1]['seq_per_s']:.1f} seq/s (epochs: {epochs}), {wall:.1f} s wall",
                  file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    reference = next((r["seq_per_s"] for r in rows if r["nproc"] == 1), rows[0]["seq_per_s"])
    print(f"\ndata-parallel training throughput, {args.preset}, global batch {cfg.train.batch_size}, "
          f"{args.epochs} epoch(s), median of the epochs after the first")
    print("| processes | seq/s | vs 1 process | wall s (whole run) |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['nproc']} | {r['seq_per_s']:.1f} | {r['seq_per_s'] / reference:.2f}x | {r['wall_seconds']:.1f} |")
    if args.out:
        from routerkt.atomic import atomic_write_json
        atomic_write_json(Path(args.out), {"preset": args.preset, "batch_size": cfg.train.batch_size,
                                           "epochs": args.epochs, "results": rows})
    return 0
