"""The paper's comparison grid, dataset x variant, resumable fold by fold (`routerkt reproduce`,
training/cli/cli_reproduce.py).

A variant is a preset, optionally with config overrides joined by '+', e.g.
`routerkt-akt+model.routing_scope=token` (training/paper/variants.py). Each (dataset, variant) is one
training run in OUT/<dataset>/<variant folder>/ (training/training_run.py: folds with a result.json are
skipped, so an interrupted run loses at most the fold in progress). Datasets are read by path from
../shared/datasets/<name>/. Runs whose routing leaks the future (`routing_scope=sequence`) are also
scored on the history only (training/eval/history_score.py), which is what a server can actually see.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from routerkt.errors import UserError
from training.data.pipeline import CANONICAL_NAMES
from training.paper.variants import Variant

DATASETS: dict[str, list[str]] = {       # dataset -> data overrides
    "assist2009": ["data.skill_rows=first"],   # the form results/ tables used: a multi-skill interaction's first skill
    "statics2011": [], "algebra2005_subset": [], "spanish_subset": [], "assist2017": [], "assist2015": [],
}


def dataset_file(root: Path, name: str) -> Path:
    for candidate in CANONICAL_NAMES:
        if (root / name / candidate).is_file():
            return root / name / candidate
    raise UserError(f"dataset {name!r} not found under {root} (expected {name}/interactions.csv[.gz])")


def job_config(path: Path, dataset: str, variant: Variant, folds: int, epochs: int, overrides: list[str]):
    """The run config of one (dataset, variant) job: its dataset's and variant's overrides, then the caller's."""
    from training.models.registry import run_config
    # the paper's grid compares window models: a preset that is a band model by default is pinned to its window
    # version here, unless the variant names its context ("akt-standard+model.context=band")
    overrides = [f"data.folds={folds}", f"train.epochs={epochs}", "model.context=window", *DATASETS.get(dataset, []),
                 *variant.overrides, *overrides]
    try:
        return run_config(variant.preset, path, overrides)
    except UserError as exc:
        raise UserError(f"{variant}: {exc}") from None


def run_grid(jobs: list[tuple[str, Variant]], configs: list, out: Path, folds: int, only_folds: int,
             nproc: int) -> list[str]:
    """Train every (dataset, variant) job not finished yet into OUT/<dataset>/<variant folder>/ (a
    leaking variant is also scored on the history only) and rewrite OUT/RESULTS.md; returns the
    jobs that failed (one failing run does not stop the grid)."""
    from tqdm import tqdm

    from training import launch as launcher
    from training.eval.history_score import history_only
    from training.paper.results_report import write_report
    bar = tqdm(list(zip(jobs, configs)), desc="reproduce", unit="run", file=sys.stderr)
    failed: list[str] = []
    for (dataset, variant), cfg in bar:
        bar.set_postfix_str(f"{dataset}/{variant}")
        run_dir = out / dataset / variant.folder
        done = run_dir / "metrics.json"
        cfg.data.run_folds = only_folds
        leaky = cfg.model.leaks_future
        if done.exists() and json.loads(done.read_text()).get("folds") == (only_folds or folds):
            if leaky:
                history_only(run_dir)                 # cached; recomputed only after a scoring change
            continue
        started = time.perf_counter()
        try:
            metrics = launcher.train(cfg, run_dir, nproc, progress=sys.stderr.isatty())
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
    return failed
