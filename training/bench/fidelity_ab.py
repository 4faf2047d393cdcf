"""Same-seed A/B of the fast training path against the plain one (issue 15, fidelity).

For each dataset x preset it trains fold 0 of the 5-fold protocol of results/RESULTS.md (the
dataset overrides of `routerkt reproduce`, e.g. assist2009's skill_rows=first) twice with the same
seed, the same folds and the same batch membership (train.batching=random in both arms):
- fast: the defaults (fused attention, batches trimmed of shared left padding, bf16 autocast where
  the CPU has bf16 kernels);
- eager: the plain implementation of the same model: explicit attention, no attention
  recomputation, float32, every batch padded to the full window. Unlike `routerkt bench train`'s
  eager mode it keeps attn_dropout at the preset's value: attention dropout is a model change, not
  an implementation detail.
Writes OUT/ab.json and OUT/ab.md: test AUC of each arm, their difference, the fold noise (sample
std over the 5 folds recorded in RESULTS/<dataset>/<preset>/metrics.json), wall time and training
throughput. Each run lives in OUT/<dataset>/<preset>/<arm>/ and resumes (a finished fold is kept).

    python -m training.bench.fidelity_ab --out bench/fidelity
    python -m training.bench.fidelity_ab --out bench/fidelity --report      # tables from finished runs only

Like the `routerkt` training commands it runs with malloc's mmap disabled (routerkt/memory.py: CPU
training is ~1.8x slower without), re-executing itself once to set that.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ARMS: dict[str, list[str]] = {
    "fast": [],
    "eager": ["model.fused_attention=false", "model.recompute_attention=false", "train.bf16=false",
              "train.trim_padding=false"],
}
COMMON = ["train.batching=random"]      # the same batch membership in both arms


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from training.data.pipeline import DATA_ROOT
    p = argparse.ArgumentParser(prog="python -m training.bench.fidelity_ab", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench/fidelity", help="output folder (resumable)")
    p.add_argument("--root", default=str(DATA_ROOT), help="datasets folder (default ../shared/datasets)")
    p.add_argument("--datasets", default="assist2009,statics2011")
    p.add_argument("--presets", default="routerkt-akt,dkt")
    p.add_argument("--arms", default="fast,eager", help=f"comma-separated, from {', '.join(ARMS)}")
    p.add_argument("--results", default="results", help="recorded 5-fold runs, for the fold noise")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run (results/ used 1)")
    p.add_argument("--epochs", type=int, default=300)
    p.add_argument("--set", dest="overrides", action="append", default=[], help="override for every run")
    p.add_argument("--report", action="store_true", help="only write the tables from finished runs")
    return p.parse_args(argv)


def arm_config(path: Path, dataset: str, preset: str, arm: str, args: argparse.Namespace):
    from training.models.registry import run_config
    from training.paper.reproduce import DATASETS
    overrides = ["data.folds=5", "data.run_folds=1", f"train.epochs={args.epochs}", f"train.threads={args.threads}",
                 *DATASETS.get(dataset, []), *COMMON, *ARMS[arm], *args.overrides]
    return run_config(preset, path, overrides)


def fold_noise(results: Path, dataset: str, preset: str) -> dict:
    """Sample std (n-1) of the recorded per-fold test AUCs, and the recorded fold-0 AUC with its batching."""
    metrics, config = results / dataset / preset / "metrics.json", results / dataset / preset / "config.json"
    if not metrics.is_file():
        return {}
    from training.config import RunConfig, from_dict
    folds = json.loads(metrics.read_text())["auc"]["folds"]
    recorded = from_dict(RunConfig, json.loads(config.read_text())).train if config.is_file() else None
    return {"folds": len(folds), "auc_sample_std": statistics.stdev(folds) if len(folds) > 1 else float("nan"),
            "auc_mean": statistics.fmean(folds), "fold0_auc": folds[0],
            "fold0_batching": recorded.batching.value if recorded else None,
            "fold0_min_steps": recorded.min_steps if recorded else None}


def read_arm(run_dir: Path) -> dict | None:
    result = run_dir / "fold-0" / "result.json"
    if not result.is_file():
        return None
    r = json.loads(result.read_text())
    out = {"test_auc": r["test"]["auc"], "test_acc": r["test"]["acc"], "test_rmse": r["test"]["rmse"],
           "valid_auc": r["valid_auc"], "best_epoch": r["best_epoch"], "epochs_run": r["epochs_run"],
           "steps": r.get("steps"), "fold_seconds": r["seconds"], "train_seq_per_s": r["train_seq_per_s"]}
    history = run_dir / "fold-0" / "history.json"
    if history.is_file():
        out["valid_auc_curve"] = [h["valid_auc"] for h in json.loads(history.read_text())]
    timing = run_dir / "ab_wall.json"
    if timing.is_file():
        out.update(json.loads(timing.read_text()))
    return out


def _f(v, spec: str) -> str:
    return "" if v is None else format(v, spec)


def write_tables(out: Path, rows: list[dict], meta: dict) -> Path:
    from routerkt.atomic import atomic_write_json
    atomic_write_json(out / "ab.json", {**meta, "rows": rows})
    lines = [
        "# Same-seed A/B: fast training path vs plain eager path (fold 0)",
        "",
        (f"Written by `{meta['command']}`. Arms (both `train.batching=random`, seed {meta['seed']}, "
         f"torch threads {meta['threads']}, fold 0 of the 5-fold protocol of results/RESULTS.md):"),
        "",
        ("- fast: the defaults (fused attention, batches trimmed of shared left padding, bf16 autocast "
         f"if the CPU has bf16 kernels: {'yes' if meta['bf16_kernels'] else 'no, so float32 here'})"),
        f"- eager: `{' '.join(ARMS['eager'])}`",
        "",
        ("fold std: sample std (n-1) of the 5 per-fold test AUCs recorded in results/ (length-bucketed "
         "batches, no min_steps); recorded fold 0: that run's fold-0 test AUC. Wall: the fold's training "
         "+ evaluation seconds. Speed ratio: fast / eager median training sequences per second. Same curve: "
         "the two arms' per-epoch validation AUCs are identical (bit for bit)."),
        "",
        ("| dataset | preset | fast AUC | eager AUC | fast - eager | fold std | recorded fold 0 "
         "| fast wall s | eager wall s | eager/fast wall | fast seq/s | eager seq/s | speed ratio "
         "| epochs (best) fast | epochs (best) eager | same curve |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        fast, eager, noise = r.get("fast") or {}, r.get("eager") or {}, r.get("fold_noise") or {}
        diff = fast["test_auc"] - eager["test_auc"] if fast and eager else None
        wall = eager["fold_seconds"] / fast["fold_seconds"] if fast and eager else None
        speed = fast["train_seq_per_s"] / eager["train_seq_per_s"] if fast and eager else None
        same = "yes" if fast and eager and fast.get("valid_auc_curve") == eager.get("valid_auc_curve") else "no"
        lines.append(
            f"| {r['dataset']} | {r['preset']} "
            f"| {_f(fast.get('test_auc'), '.4f')} | {_f(eager.get('test_auc'), '.4f')} "
            f"| {_f(diff, '+.5f')} | {_f(noise.get('auc_sample_std'), '.4f')} | {_f(noise.get('fold0_auc'), '.4f')} "
            f"| {_f(fast.get('fold_seconds'), '.0f')} | {_f(eager.get('fold_seconds'), '.0f')} | {_f(wall, '.2f')} "
            f"| {_f(fast.get('train_seq_per_s'), '.0f')} | {_f(eager.get('train_seq_per_s'), '.0f')} "
            f"| {_f(speed, '.2f')} "
            f"| {fast.get('epochs_run', '')} ({fast.get('best_epoch', '')}) | {eager.get('epochs_run', '')} "
            f"({eager.get('best_epoch', '')}) | {same if fast and eager else ''} |")
    (out / "ab.md").write_text("\n".join(lines) + "\n")
    return out / "ab.md"


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        from routerkt.memory import run_like_training
        run_like_training("training.bench.fidelity_ab", sys.argv[1:])   # routerkt/memory.py, as `routerkt train`
    args = parse_args(argv)
    from routerkt.atomic import atomic_write_json
    from training.fold_training import bf16_available
    from training.paper.reproduce import dataset_file
    out = Path(args.out)
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    for a in arms:
        if a not in ARMS:
            raise SystemExit(f"unknown arm {a!r}; choose from {', '.join(ARMS)}")
    jobs = [(d, dataset_file(Path(args.root), d), p, a) for d in datasets for p in presets for a in arms]
    configs = [arm_config(path, d, p, a, args) for d, path, p, a in jobs]     # validate every job first
    if not args.report:
        from training.training_run import run_training
        for (dataset, _, preset, arm), cfg in zip(jobs, configs):
            run_dir = out / dataset / preset / arm
            if read_arm(run_dir) is not None:
                print(f"{dataset}/{preset}/{arm}: done, kept", file=sys.stderr)
                continue
            started = time.perf_counter()
            run_training(cfg, run_dir, progress=False)
            wall = time.perf_counter() - started
            atomic_write_json(run_dir / "ab_wall.json", {"wall_seconds": round(wall, 1)})
            print(f"{dataset}/{preset}/{arm}: test auc {read_arm(run_dir)['test_auc']:.4f} ({wall:.0f} s)",
                  file=sys.stderr)
    rows = []
    for dataset in datasets:
        for preset in presets:
            row = {"dataset": dataset, "preset": preset,
                   "fold_noise": fold_noise(Path(args.results), dataset, preset)}
            for arm in arms:
                row[arm] = read_arm(out / dataset / preset / arm)
            if row.get("fast") and row.get("eager"):
                row["auc_fast_minus_eager"] = row["fast"]["test_auc"] - row["eager"]["test_auc"]
                row["speed_ratio"] = row["fast"]["train_seq_per_s"] / row["eager"]["train_seq_per_s"]
                row["wall_ratio_eager_over_fast"] = row["eager"]["fold_seconds"] / row["fast"]["fold_seconds"]
                row["same_valid_curve"] = row["fast"].get("valid_auc_curve") == row["eager"].get("valid_auc_curve")
            rows.append(row)
    first = configs[0]
    given = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--report"]    # the training command
    meta = {"command": "python -m training.bench.fidelity_ab " + " ".join(given),
            "arms": {a: COMMON + ARMS[a] for a in arms}, "seed": first.train.seed, "threads": args.threads,
            "bf16_kernels": bf16_available(), "epochs": args.epochs, "min_steps": first.train.min_steps,
            "patience": first.train.patience}
    path = write_tables(out, rows, meta)
    for row in rows:                                  # the curves only decide "same curve"; kept out of ab.json
        for arm in arms:
            (row.get(arm) or {}).pop("valid_auc_curve", None)
    atomic_write_json(out / "ab.json", {**meta, "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
