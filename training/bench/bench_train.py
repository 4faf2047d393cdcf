"""`routerkt bench train`: training throughput (sequences per second) per preset on the same data.

All presets run in one invocation, interleaved so machine drift hits every variant alike.

Each measurement trains one epoch (or --batches batches) of fold 0's training learners with a fixed
batch order. Two modes:
- optimized: this project's defaults (fused attention, no dropout on attention probabilities,
  uniformly shuffled batches trimmed of shared padding, bf16 autocast where the CPU has it);
- eager: the plain implementation (explicit attention with attention dropout, float32, uniformly
  shuffled batches each padded to the full window), the reference point for the speed-up ratio.
Both modes draw the same batch membership (train.batching=random); `--set train.batching=length_bucketed`
measures the opt-in length-sorted batches, which change training results (training/config.py Batching).
Prints a table with each preset's throughput and its ratio to the first preset, and (with both
modes) the optimized/eager speed-up; --out writes the numbers as JSON.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

MODES = {
    "optimized": [],
    "eager": ["model.fused_attention=false", "model.attn_dropout=0.05", "train.batching=random",
              "train.trim_padding=false", "train.bf16=false"],
}
DEFAULT_PRESETS = "routerkt-akt,akt-standard,alibi-akt,relative-akt,akt"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default=None, help="canonical CSV (default: 600 synthetic learners)")
    p.add_argument("--presets", default=DEFAULT_PRESETS, help="comma-separated presets")
    p.add_argument("--modes", default="optimized", help="comma-separated: optimized, eager")
    p.add_argument("--batches", type=int, default=0, help="batches per measurement (0 = one full epoch)")
    p.add_argument("--repeats", type=int, default=2, help="interleaved repetitions (median reported)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = all cores)")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="config override for every run")
    p.add_argument("--out", default=None, help="write results JSON here")


def measure(cfg, seqs, batches: int, seed: int = 0) -> float:
    import torch
    from training.batching import iterate
    from training.fold_training import batch_loss
    from training.models.registry import build_model
    torch.manual_seed(seed)
    model = build_model(cfg.model).train()
    opt = torch.optim.Adam(model.parameters(), lr=cfg.train.lr)
    # one untimed warm-up step on the first batch
    train_cfg = cfg.train
    first = next(iterate(seqs, train_cfg.batch_size, shuffle=True, batching=train_cfg.batching,
                         trim=train_cfg.trim_padding, seed=seed))
    loss, _ = batch_loss(model, first, cfg.train.bf16)
    loss.backward()
    opt.zero_grad()
    n, started = 0, time.perf_counter()
    for i, batch in enumerate(iterate(seqs, train_cfg.batch_size, shuffle=True, batching=train_cfg.batching,
                                      trim=train_cfg.trim_padding, seed=seed)):
        if batches and i >= batches:
            break
        loss, _ = batch_loss(model, batch, cfg.train.bf16)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        opt.step()
        n += batch.size
    return n / (time.perf_counter() - started)


def run(args: argparse.Namespace) -> int:
    import tempfile

    import torch
    from routerkt.errors import UserError
    from training.models.registry import run_config
    from training.training_run import prepare

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            raise UserError(f"unknown mode {m!r}; choose from {', '.join(MODES)}")
    data = args.data
    if data is None:
        from training.data.synthetic import generate, write_csv
        data = str(Path(tempfile.mkdtemp(prefix="routerkt-bench-")) / "synthetic.csv")
        write_csv(generate(n_learners=600, seed=7), data)
    prepared = {}
    for preset in presets:
        for mode in modes:
            cfg, _, seqs, folds = prepare(run_config(preset, data, MODES[mode] + args.overrides))
            prepared[(preset, mode)] = (cfg, seqs.select_learners(folds[0].train))
    samples: dict[tuple[str, str], list[float]] = {k: [] for k in prepared}
    for rep in range(args.repeats):
        for key, (cfg, train) in prepared.items():           # interleaved: every variant once per repeat
            samples[key].append(measure(cfg, train, args.batches, seed=rep))
            print(f"repeat {rep} {key[0]:<18} {key[1]:<9} {samples[key][-1]:8.1f} seq/s", file=sys.stderr)
    median = {k: statistics.median(v) for k, v in samples.items()}
    reference = median[(presets[0], modes[0])]
    n_train = len(next(iter(prepared.values()))[1])
    print(f"\ntraining throughput, {n_train} training sequences of {data}, torch threads {torch.get_num_threads()}, "
          f"median of {args.repeats}")
    _print_table(samples, median, presets[0], len(modes) > 1)
    if args.out:
        from routerkt.atomic import atomic_write_json
        from training.data.pipeline import portable_path
        atomic_write_json(Path(args.out), {
            "data": portable_path(data), "threads": torch.get_num_threads(), "repeats": args.repeats,
            "batches": args.batches, "reference": reference,
            "results": [{"preset": p, "mode": m, "median_seq_per_s": median[(p, m)], "samples": samples[(p, m)]}
                        for (p, m) in median]})
    return 0


def _print_table(samples: dict[tuple[str, str], list[float]], median: dict[tuple[str, str], float],
                 first: str, both_modes: bool) -> None:
    """One row per (preset, mode): median, range, ratio to the first preset and (both modes) to eager."""
    header = f"| preset | mode | seq/s (median) | min..max | vs {first} |"
    header += " optimized / eager |" if both_modes else ""
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for (preset, mode), value in median.items():
        seen = samples[(preset, mode)]
        row = (f"| {preset} | {mode} | {value:.0f} | {min(seen):.0f}..{max(seen):.0f} "
               f"| {value / median[(first, mode)]:.2f}x |")
        if both_modes:
            against_eager = (preset, "eager") in median and mode != "eager"
            row += f" {value / median[(preset, 'eager')]:.2f}x |" if against_eager else " |"
        print(row)
