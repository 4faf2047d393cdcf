"""`routerkt audit`: leak audit of a trained run (the checks: training/eval/leak_audit.py); writes DIR/audit.json.

Exit code 0 for PASS, 1 for FAIL or LEAKS BY DESIGN, 2 for bad input (one line).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from routerkt.errors import UserError
from training.eval.leak_audit import CONTROL_SIGMAS, CONTROL_TOL, PASS, PROBE_TOL, VISIBLE_MAX_SHARE, audit_run


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", required=True, help="training run directory (written by `routerkt train`)")
    p.add_argument("--data", default=None, help="the run's canonical CSV (default: the run's recorded data.path)")
    p.add_argument("--fold", type=int, default=None, help="fold checkpoint (default: best validation AUC)")
    p.add_argument("--probe-windows", type=int, default=256, help="test windows in the perturbation probe")
    p.add_argument("--visible-threshold", type=float, default=VISIBLE_MAX_SHARE,
                   help=f"largest passing share of visible answers (default {VISIBLE_MAX_SHARE})")
    p.add_argument("--control-epochs", type=int, default=3, help="epochs of the shuffled-label control")
    p.add_argument("--skip-control", action="store_true", help="leave out the shuffled-label control")
    p.add_argument("--seed", type=int, default=0, help="seed of the probe sample and the label permutation")
    p.add_argument("--batch-size", type=int, default=256)


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run)
    if not run_dir.is_dir():
        raise UserError(f"--run {run_dir}: not a directory")
    if args.probe_windows < 1 or args.control_epochs < 1:
        raise UserError("--probe-windows and --control-epochs must be >= 1")
    report = audit_run(run_dir, fold=args.fold, data=args.data, probe_windows=args.probe_windows,
                       visible_threshold=args.visible_threshold, control_epochs=args.control_epochs,
                       skip_control=args.skip_control, seed=args.seed, batch_size=args.batch_size)
    probe, visible = report["probe"], report["visible_answers"]
    control = None if report["control"].get("skipped") else report["control"]
    tag = " (leaks by design: ModelConfig.leaks_future)" if probe["leaks_by_design"] else ""
    print(f"(a) probe: {probe['windows']} test windows, max |diff| at positions <= t {probe['max_diff']:.3g} "
          f"(tolerance {PROBE_TOL:g}; after t {probe['max_diff_after_cut']:.3g}){tag}")
    print(f"(b) visible answers: {visible['visible']} of {visible['scored']} scored positions "
          f"({visible['visible_share']:.4%}, threshold {args.visible_threshold:.4%}); identical repeats "
          f"(not judged) {visible['identical_repeat_share']:.4%}")
    if control is None:
        print("(c) shuffled-label control: skipped")
    else:
        print(f"(c) shuffled-label control: test AUC {control['auc']:.4f} on {control['n']} positions after "
              f"{control['epochs_run']} epoch(s) (must be 0.5 +- {control['tolerance']:.3f}: {CONTROL_TOL} or "
              f"{CONTROL_SIGMAS:g} null stds of {control['null_std']:.4f}, the wider)")
    for reason in report["reasons"]:
        print(f"  FAIL {reason}")
    result = report["verdict"]
    print(f"verdict: {result}{' (control skipped)' if control is None else ''}  -> {run_dir / 'audit.json'}")
    return 0 if result == PASS else 1
