"""`routerkt reproduce`: the paper's comparison, dataset x variant, resumable fold by fold.

A variant is a preset, optionally with config overrides joined by '+', e.g.
`routerkt-akt+model.routing_scope=token` (training/variants.py). Each (dataset, variant) is one
training run in OUT/<dataset>/<variant folder>/ (training/run.py: folds with a result.json are
skipped, so an interrupted run loses at most the fold in progress). Datasets are read by path from
../shared/datasets/<name>/. Runs whose routing leaks the future (`routing_scope=sequence`) are also
scored on the history only (training/history_score.py), which is what a server can actually see.

    routerkt reproduce --datasets statics2011 --presets main --out results
    routerkt reproduce --datasets statics2011,assist2009 --presets ablations --out results
    routerkt reproduce --report --out results          # writes results/RESULTS.md from what ran
    routerkt reproduce --diversity --datasets statics2011 --presets akt-family --out results
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from routerkt.errors import UserError
from training.data.pipeline import CANONICAL_NAMES, DATA_ROOT
from training.variants import GROUPS, Variant, expand

DATASETS: dict[str, list[str]] = {       # dataset -> data overrides
    "assist2009": ["data.collapse_repeats=true"],   # multi-skill duplicated rows (dataset README)
    "statics2011": [], "algebra2005_subset": [], "spanish_subset": [], "assist2017": [], "assist2015": [],
}


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
    p.add_argument("--diversity", action="store_true",
                   help="attention-pattern analysis (Spearman/SSIM, heatmaps) of the finished runs of --datasets x --presets")
    p.add_argument("--learners", type=int, default=50, help="learners for --diversity")
    p.add_argument("--dry-run", action="store_true", help="list the jobs and exit")
    p.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="data-parallel processes per training run (training/launcher.py; not under torchrun)")


def dataset_file(root: Path, name: str) -> Path:
    for candidate in CANONICAL_NAMES:
        if (root / name / candidate).is_file():
            return root / name / candidate
    raise UserError(f"dataset {name!r} not found under {root} (expected {name}/interactions.csv[.gz])")


def job_config(path: Path, dataset: str, variant: Variant, args: argparse.Namespace):
    from training.models.registry import run_config
    overrides = [f"data.folds={args.folds}", f"train.epochs={args.epochs}", *DATASETS.get(dataset, []),
                 *variant.overrides, *args.overrides]
    try:
        return run_config(variant.preset, path, overrides)
    except UserError as exc:
        raise UserError(f"{variant}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    from training.history_score import history_only
    from training.report import write_report
    out = Path(args.out)
    if args.diversity:
        from training.diversity import analyse
        for dataset in (d.strip() for d in args.datasets.split(",") if d.strip()):
            try:
                path = analyse(out, dataset, [v.folder for v in expand(args.presets)], args.learners)
            except ValueError as exc:
                raise UserError(str(exc)) from None
            print(f"wrote {path}")
        write_report(out)
        return 0
    if args.report:
        path = write_report(out)
        print(f"wrote {path}")
        return 0
    from tqdm import tqdm
    from training import launcher
    from training.distributed import from_env
    if from_env() is not None:
        raise UserError("reproduce does not run under torchrun (each rank would run the whole grid); use --nproc N")
    if args.nproc < 1:
        raise UserError("--nproc must be >= 1")
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    variants = expand(args.presets)
    jobs = [(d, dataset_file(Path(args.root), d), v) for d in datasets for v in variants]
    configs = [job_config(p, d, v, args) for d, p, v in jobs]      # validate every job before starting
    if args.dry_run:
        for (d, _, v), cfg in zip(jobs, configs):
            print(f"{d:<20} {v!s:<45} -> {out / d / v.folder}")
        return 0
    bar = tqdm(list(zip(jobs, configs)), desc="reproduce", unit="run", file=sys.stderr)
    failed: list[str] = []
    for (dataset, _, variant), cfg in bar:
        bar.set_postfix_str(f"{dataset}/{variant}")
        run_dir = out / dataset / variant.folder
        done = run_dir / "metrics.json"
        cfg.data.run_folds = args.only_folds
        leaky = cfg.model.leaks_future
        if done.exists() and json.loads(done.read_text()).get("folds") == (args.only_folds or args.folds):
            if leaky:
                history_only(run_dir)                 # cached; recomputed only after a scoring change
            continue
        started = time.perf_counter()
        try:
            metrics = launcher.train(cfg, run_dir, args.nproc, progress=sys.stderr.isatty())
            if leaky:
                metrics["history_only"] = history_only(run_dir)
        except (RuntimeError, MemoryError, UserError) as exc:   # one failing run must not stop the grid
            failed.append(f"{dataset}/{variant}")
            tqdm.write(f"{dataset}/{variant}: FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}",
                       file=sys.stderr)
            continue
        tqdm.write(f"{dataset}/{variant}: auc {metrics['auc']['mean']:.4f} +- {metrics['auc']['std']:.4f} "
                   f"({metrics['folds']} folds, {time.perf_counter() - started:.0f}s)", file=sys.stderr)
    write_report(out)
    if failed:
        print(f"failed runs (rerun the same command to resume them): {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0
