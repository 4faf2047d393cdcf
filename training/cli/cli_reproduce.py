"""`routerkt reproduce`: run the paper's comparison grid, resumable (the grid: training/paper/reproduce.py).

    routerkt reproduce --datasets statics2011 --presets main --out results
    routerkt reproduce --datasets statics2011,assist2009 --presets ablations --out results
    routerkt reproduce --report --out results          # writes results/RESULTS.md from what ran
    routerkt reproduce --diversity --datasets statics2011 --presets akt-family --out results
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from routerkt.errors import UserError
from training.data.pipeline import DATA_ROOT
from training.paper.reproduce import dataset_file, job_config, run_grid
from training.paper.variants import GROUPS, expand


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--datasets", default="statics2011", help="comma-separated names under --root")
    p.add_argument("--presets", default="main", help=f"comma-separated variants or groups ({', '.join(GROUPS)})")
    p.add_argument("--out", default="results", help="results directory (resumable)")
    p.add_argument("--root", default=str(DATA_ROOT), help="datasets folder (default ../shared/datasets)")
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--only-folds", type=int, default=0, help="stop after this many folds per run (0 = all)")
    p.add_argument("--epochs", type=int, default=300)
    p.add_argument("--set", dest="overrides", action="append", default=[], help="override for every run")
    p.add_argument("--report", action="store_true", help="only write OUT/RESULTS.md from finished runs")
    p.add_argument("--protocols", action="store_true",
                   help="only score every finished run under OUT by the paper's and the served protocol "
                        "(cached per run) and write OUT/PROTOCOLS.md, window against band by fold")
    p.add_argument("--diversity", action="store_true",
                   help="attention-pattern analysis (Spearman/SSIM, heatmaps) of the finished runs of "
                        "--datasets x --presets")
    p.add_argument("--learners", type=int, default=50, help="learners for --diversity")
    p.add_argument("--dry-run", action="store_true", help="list the jobs and exit")
    p.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="data-parallel processes per training run (training/launch.py; not under torchrun)")


def _names(text: str) -> list[str]:
    return [d.strip() for d in text.split(",") if d.strip()]


def run(args: argparse.Namespace) -> int:
    from training.paper.results_report import write_report
    out = Path(args.out)
    if args.diversity:
        from training.eval.diversity import analyse
        for dataset in _names(args.datasets):
            try:
                path = analyse(out, dataset, [v.folder for v in expand(args.presets)], args.learners)
            except ValueError as exc:
                raise UserError(str(exc)) from None
            print(f"wrote {path}")
        write_report(out)
        return 0
    if args.protocols:
        from training.eval.served_protocol import write_table
        print(f"wrote {write_table(out)}")
        return 0
    if args.report:
        path = write_report(out)
        print(f"wrote {path}")
        return 0
    from training.distributed import from_env
    if from_env() is not None:
        raise UserError("reproduce does not run under torchrun (each rank would run the whole grid); use --nproc N")
    if args.nproc < 1:
        raise UserError("--nproc must be >= 1")
    variants = expand(args.presets)
    jobs = [(d, dataset_file(Path(args.root), d), v) for d in _names(args.datasets) for v in variants]
    # validate every job before starting
    configs = [job_config(p, d, v, args.folds, args.epochs, args.overrides) for d, p, v in jobs]
    if args.dry_run:
        for (d, _, v), cfg in zip(jobs, configs):
            print(f"{d:<20} {v!s:<45} -> {out / d / v.folder}")
        return 0
    failed = run_grid([(d, v) for d, _, v in jobs], configs, out, args.folds, args.only_folds, args.nproc)
    if failed:
        print(f"failed runs (rerun the same command to resume them): {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0
