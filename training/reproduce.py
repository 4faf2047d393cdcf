"""`routerkt reproduce`: the paper's comparison, dataset x variant, resumable fold by fold.

A variant is a preset, optionally with config overrides joined by '+', e.g.
`routerkt-akt+model.routing_scope=token`. Each (dataset, variant) is one training run in
OUT/<dataset>/<variant>/ (training/run.py: folds with a result.json are skipped, so an interrupted
run loses at most the fold in progress). Datasets are read by path from ../shared/datasets/<name>/.
Runs of the leaking whole-window routing (`routing_scope=sequence`) are also scored on the history
only (each position predicted from its own prefix), which is what a server can actually see.

    routerkt reproduce --datasets statics2011 --presets main --out results
    routerkt reproduce --datasets statics2011,assist2009 --presets ablations --out results
    routerkt reproduce --report --out results          # writes results/RESULTS.md from what ran
    routerkt reproduce --diversity --datasets statics2011 --presets akt-family --out results
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from routerkt.errors import UserError

DEFAULT_ROOT = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
DATASETS: dict[str, list[str]] = {       # dataset -> data overrides
    "assist2009": ["data.collapse_repeats=true"],   # multi-skill duplicated rows (dataset README)
    "statics2011": [], "algebra2005_subset": [], "spanish_subset": [], "assist2017": [], "assist2015": [],
}
# DKT at batch 512 takes ONE optimizer step per epoch on the small datasets (a few hundred training
# learners), so patience 10 can stop it before it learns (statics2011 fold 1: best epoch 0). The
# paper-setting row stays; this row gives the LSTM baseline the steps it needs.
DKT_SMALL_BATCH = "dkt+train.batch_size=64"
GROUPS: dict[str, list[str]] = {
    "main": ["akt", "akt-standard", "folibi-akt", "rkt-akt", "routerkt-akt", "cl4kt", "routerkt-cl4kt",
             "simplekt", "routerkt-simplekt", "dkt", DKT_SMALL_BATCH],
    "akt-family": ["akt", "akt-standard", "folibi-akt", "rkt-akt", "routerkt-akt", "dkt", DKT_SMALL_BATCH],
    "ablations": [
        "routerkt-akt+model.routing_scope=token",          # person-wise (prefix) vs token-wise
        "routerkt-akt+model.experts=ffn",                  # heads vs FFN experts
        "routerkt-akt+model.n_shared=0",                   # without a shared head
        "routerkt-akt+model.routing_scope=sequence",       # the paper's leaking whole-window routing
    ],
    "grid": [f"routerkt-akt+model.n_selected={k}" for k in (1, 4)]
    + [f"routerkt-akt+model.n_shared={s}" for s in (2, 4)]
    + [f"routerkt-akt+model.balance_beta={b}" for b in (0.0, 0.001, 0.1)],
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--datasets", default="statics2011", help="comma-separated names under --root")
    p.add_argument("--presets", default="main", help=f"comma-separated variants or groups ({', '.join(GROUPS)})")
    p.add_argument("--out", default="results", help="results directory (resumable)")
    p.add_argument("--root", default=str(DEFAULT_ROOT), help="datasets folder (default ../shared/datasets)")
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--only-folds", type=int, default=0, help="stop after this many folds per run (0 = all)")
    p.add_argument("--epochs", type=int, default=300)
    p.add_argument("--set", dest="overrides", action="append", default=[], help="override for every run")
    p.add_argument("--report", action="store_true", help="only write OUT/RESULTS.md from finished runs")
    p.add_argument("--diversity", action="store_true",
                   help="attention-pattern analysis (Spearman/SSIM, heatmaps) of the finished runs of --datasets x --presets")
    p.add_argument("--learners", type=int, default=50, help="learners for --diversity")
    p.add_argument("--dry-run", action="store_true", help="list the jobs and exit")


def expand(spec: str) -> list[str]:
    out: list[str] = []
    for item in (s.strip() for s in spec.split(",")):
        if item:
            out.extend(GROUPS.get(item, [item]))
    return list(dict.fromkeys(out))


def variant_dir(variant: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=+-]", "_", variant.replace("model.", "").replace("train.", "").replace("data.", ""))


def dataset_file(root: Path, name: str) -> Path:
    for candidate in ("interactions.csv.gz", "interactions.csv"):
        if (root / name / candidate).is_file():
            return root / name / candidate
    raise UserError(f"dataset {name!r} not found under {root} (expected {name}/interactions.csv[.gz])")


def job_config(dataset: str, path: Path, variant: str, args: argparse.Namespace):
    from training.config import RunConfig, apply_overrides
    from training.models.registry import preset_config
    preset, *extra = variant.split("+")
    cfg = RunConfig(preset=preset, model=preset_config(preset))
    cfg.data.path, cfg.data.folds, cfg.train.epochs = str(path), args.folds, args.epochs
    try:
        return apply_overrides(cfg, DATASETS.get(dataset, []) + extra + args.overrides)
    except ValueError as exc:
        raise UserError(f"{variant}: {exc}") from None


# Caches written by an older scoring (which left the label in the last window slot) are recomputed.
HISTORY_SCORING = "prefix, label hidden"


def _finished_folds(run: Path) -> list[Path]:
    return [d for d in sorted(run.glob("fold-*")) if (d / "result.json").exists()]


def _history_key(finished: list[Path]) -> dict:
    return {"scoring": HISTORY_SCORING, "scored_folds": [d.name for d in finished]}


def cached_history_only(run: Path) -> dict | None:
    """The run's history-only score if its cache is current (this scoring, these finished folds)."""
    cache = run / "history_only.json"
    if not cache.exists():
        return None
    cached = json.loads(cache.read_text())
    key = _history_key(_finished_folds(run))
    return cached if all(cached.get(k) == v for k, v in key.items()) else None


def history_only(run: Path) -> dict:
    """Score every fold's test set from prefixes only (for leaking variants); cached in the run."""
    from training.checkpoint import load_checkpoint
    from routerkt.atomic import atomic_write_json
    from training.metrics import aggregate, summarize
    from training.analysis import prefix_predictions
    from training.run import prepare
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
    atomic_write_json(run / "history_only.json", out)
    return out


def run(args: argparse.Namespace) -> int:
    from training.report import write_report
    out = Path(args.out)
    if args.diversity:
        from training.diversity import analyse
        for dataset in (d.strip() for d in args.datasets.split(",") if d.strip()):
            try:
                path = analyse(out, dataset, [variant_dir(v) for v in expand(args.presets)], args.learners)
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
    from training.run import run_training
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    variants = expand(args.presets)
    jobs = [(d, dataset_file(Path(args.root), d), v) for d in datasets for v in variants]
    configs = [job_config(d, p, v, args) for d, p, v in jobs]      # validate every job before starting
    if args.dry_run:
        for (d, _, v), cfg in zip(jobs, configs):
            print(f"{d:<20} {v:<45} -> {out / d / variant_dir(v)}")
        return 0
    bar = tqdm(list(zip(jobs, configs)), desc="reproduce", unit="run", file=sys.stderr)
    failed: list[str] = []
    for (dataset, _, variant), cfg in bar:
        bar.set_postfix_str(f"{dataset}/{variant}")
        run_dir = out / dataset / variant_dir(variant)
        done = run_dir / "metrics.json"
        cfg.data.run_folds = args.only_folds
        leaky = cfg.model.routing_scope.value == "sequence" and cfg.model.heads.value == "router"
        if done.exists() and json.loads(done.read_text()).get("folds") == (args.only_folds or args.folds):
            if leaky:
                history_only(run_dir)                 # cached; recomputed only after a scoring change
            continue
        started = time.perf_counter()
        try:
            metrics = run_training(cfg, run_dir, progress=sys.stderr.isatty())
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
