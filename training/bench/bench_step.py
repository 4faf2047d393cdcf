"""Torch CPU time of the incremental step path (training/models/step.py) against the full rank forward, and state sizes.

    routerkt bench step [--preset routerkt-akt] [--threads 1] [--repeats 200] [--batches 1,32]

At the default config (window W = max_len = 100), for B learners at once (B = 1: per-call overheads
dominate in eager PyTorch; larger B: the arithmetic): `step` (k = 1) from a kept history of
98 to 99 interactions (inside the window: incremental), the same past the edge (99 -> 99 kept, a
rebuild), `predict_next` for C = 1 and 20 candidates, and the served full path, KTModel.rank on a
history of 99 with the same candidates. Medians over interleaved repeats (wall time of one call,
torch intra-op threads as given). Then the bytes a state holds per learner at a history of 99, per
preset. Random weights: timings do not depend on them.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from routerkt.errors import UserError
from training.models.registry import PRESETS, build_model, preset_config, with_vocab
from training.models.step import predict_next, start_state, step

NQ, NS = 1000, 100


def _model(preset: str):
    torch.manual_seed(0)
    return build_model(with_vocab(preset_config(preset), NQ, NS)).eval()


def _rows(n: int, seed: int, B: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(2, NQ, (B, n), generator=g), torch.randint(2, NS, (B, n), generator=g),
            torch.randint(0, 2, (B, n), generator=g))


def timings(preset: str, repeats: int, B: int = 1) -> dict[str, float]:
    """Median milliseconds per call of each measured operation, B learners per call."""
    model = _model(preset)
    W = model.config.max_len
    q, s, r = _rows(W, seed=1, B=B)                                  # 100 interactions each
    inside = start_state(model, q[:, :W - 2], s[:, :W - 2], r[:, :W - 2])     # 98 kept
    full = start_state(model, q[:, :W - 1], s[:, :W - 1], r[:, :W - 1])       # 99 kept: the next step slides
    last = (q[:, -1:], s[:, -1:], r[:, -1:])
    stepped = step(model, inside, *last)
    candidates = {c: _rows(c, seed=2 + c, B=B)[:2] for c in (1, 20)}
    ops = {
        "step k=1 (98 -> 99, incremental)": lambda: step(model, inside, *last),
        "step k=1 past the edge (rebuild of 99)": lambda: step(model, full, *last),
    }
    for c, (cq, cs) in candidates.items():
        ops[f"predict_next C={c}"] = lambda cq=cq, cs=cs: predict_next(model, stepped, cq, cs)
        ops[f"full rank forward, history 99, C={c}"] = lambda cq=cq, cs=cs: _rank(model, stepped, cq, cs)
    samples: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(repeats):
        for name, op in ops.items():
            t = time.perf_counter()
            op()
            samples[name].append((time.perf_counter() - t) * 1e3)
    return {name: statistics.median(values) for name, values in samples.items()}


def _rank(model, state, cq, cs) -> torch.Tensor:
    with torch.no_grad():
        return torch.sigmoid(model.rank(state.questions, state.skills, state.responses, cq, cs))


def state_bytes() -> dict[str, dict[str, int]]:
    """Per preset: bytes of one learner's state at a kept history of W - 1 (single-skill sets)."""
    out = {}
    for preset in PRESETS:
        model = _model(preset)
        W = model.config.max_len
        q, s, r = _rows(W - 1, seed=3)
        out[preset] = start_state(model, q, s, r).nbytes()
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="routerkt-akt", choices=sorted(PRESETS))
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--repeats", type=int, default=200, help="interleaved repeats per operation")
    parser.add_argument("--batches", default="1,32", help="learners per call, comma-separated")


def run(args: argparse.Namespace) -> int:
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        raise UserError(f"--batches: comma-separated integers expected, got {args.batches!r}") from None
    if min(batches) < 1 or args.repeats < 1 or args.threads < 1:
        raise UserError("--batches, --repeats and --threads must be positive")
    torch.set_num_threads(args.threads)
    for B in batches:
        print(f"{args.preset}, default config, B={B} learner(s) per call, torch {torch.__version__}, "
              f"{args.threads} thread(s), median of {args.repeats}")
        results = timings(args.preset, args.repeats, B)
        for c in (1, 20):
            results[f"step + predict_next C={c}"] = (results["step k=1 (98 -> 99, incremental)"]
                                                     + results[f"predict_next C={c}"])
        for name, ms in results.items():
            print(f"  {name:42s} {ms:8.3f} ms")
    print("state bytes per learner at a history of W - 1 = 99 (cache | kept history ids):")
    for preset, sizes in state_bytes().items():
        print(f"  {preset:20s} {sizes['cache']:9d} | {sizes['history']:6d}")
    return 0
