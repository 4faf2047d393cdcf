"""`routerkt bench throughput`: inference throughput of the attention variants at three levels, in one run.

Side by side, in the RouterKT paper's Table 4 setting (batch 512, history length 100).

Levels, each measured on the same fixed batch of full-length windows:
  pytorch      eager PyTorch, eval mode, inference_mode
  onnxruntime  the exported ONNX model in-process (graph optimisation ALL, intra-op threads)
  onnxruntime-fused  the same graph after the attention-fusion pass (export/attention_fusion.py:
               each attention core one com.microsoft.MultiHeadAttention; monotonic stays plain)
  triton       the same ONNX model served by the bundled tritonserver (python backend running
               onnxruntime, dynamic batching on), called through tritonclient's gRPC client: the batch
               is sent as `--triton-requests` concurrent requests that the dynamic batcher merges.
Variants are interleaved inside each repetition so machine drift hits all of them alike; every
(variant, level) gets warm-up calls first. Weights are random (speed does not depend on them).
The same run measures the CPU's float32 matmul peak (numpy) and counts each model's FLOPs per
sample (torch's FlopCounterMode on the eager forward), so every level's samples/s is also shown as
GFLOP/s and a share of the peak.
Writes OUT/throughput.json ({level: {preset: median samples/s}} plus spreads and settings),
OUT/throughput.md (ratios to standard attention beside the paper's) and OUT/throughput_chart.png.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from export.bench_inputs import DEFAULT_PRESETS, N_QUESTIONS, N_SKILLS, make_batch
from loadtest.harness import add_common_flags, start_triton
from loadtest.timing import matmul_peak_gflops

LEVELS = ("pytorch", "onnxruntime", "onnxruntime-fused", "triton")
LABELS = {"akt-standard": "standard", "routerkt-akt": "RouterKT", "alibi-akt": "ALiBi (all layers)",
          "relative-akt": "relative (RKT-style)", "akt": "monotonic (AKT)"}
PAPER_RATIO = {"akt-standard": "1.00", "routerkt-akt": "0.87-0.89", "alibi-akt": "0.75",
               "relative-akt": "0.73", "akt": "0.31"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--seq-len", type=int, default=100)
    p.add_argument("--presets", default=",".join(DEFAULT_PRESETS), help="comma-separated; the first is the reference")
    p.add_argument("--levels", default=",".join(LEVELS))
    p.add_argument("--repeats", type=int, default=5, help="interleaved timed repetitions (median reported)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2, help="torch and onnxruntime intra-op threads")
    p.add_argument("--triton-requests", type=int, default=8, help="concurrent requests the batch is split into")
    add_common_flags(p, "throughput", model=False)


class TorchLevel:
    def __init__(self, model):
        self.model = model

    def __call__(self, feeds: dict[str, np.ndarray]) -> None:
        import torch
        with torch.inference_mode():
            self.model(*(torch.from_numpy(feeds[k]) for k in ("questions", "skills", "responses")))


class OrtLevel:
    def __init__(self, path: Path, threads: int):
        from routerkt.contract.onnx_session import cpu_session
        self.session = cpu_session(path, threads=threads)

    def __call__(self, feeds: dict[str, np.ndarray]) -> None:
        self.session.run(["probs"], feeds)


class TritonLevel:
    """Splits the batch into concurrent requests (tritonclient gRPC async_infer on one channel)."""

    def __init__(self, url: str, name: str, requests: int):
        import tritonclient.grpc as grpcclient
        self.module, self.name, self.requests = grpcclient, name, requests
        self.client = grpcclient.InferenceServerClient(url)

    def __call__(self, feeds: dict[str, np.ndarray]) -> None:
        import threading
        parts = [{k: v[i::self.requests] for k, v in feeds.items()} for i in range(self.requests)]
        done, errors, lock = threading.Event(), [], threading.Lock()
        pending = [len(parts)]

        def finished(result, error) -> None:
            with lock:
                if error is not None:
                    errors.append(error)
                pending[0] -= 1
                if pending[0] == 0:
                    done.set()
        for part in parts:
            inputs = []
            for key, array in part.items():
                tensor = self.module.InferInput(key, list(array.shape), "INT64")
                tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            self.client.async_infer(self.name, inputs, finished, client_timeout=120.0,
                                    outputs=[self.module.InferRequestedOutput("probs")])
        if not done.wait(180.0) or errors:
            raise RuntimeError(f"triton inference failed: {errors[:1] or 'timeout'}")

    def close(self) -> None:
        self.client.close()


def build_repository(presets: list[str], models: dict, onnx: dict[str, Path], repo: Path, batch: int,
                     length: int, threads: int) -> None:
    from export.repository import publish_version
    from export.triton_python_model import PYTHON_MODEL_FILES
    from export.triton_config import PARAM_N_QUESTIONS, PARAM_N_SKILLS, TritonModelOptions, render_config
    for preset in presets:
        options = TritonModelOptions(window=length, max_batch_size=max(batch, 8), ort_intra_op_threads=threads,
                                     preferred_batch_sizes=sorted({min(batch, 128), min(batch, 256), batch}),
                                     max_queue_delay_us=5000,
                                     parameters={PARAM_N_QUESTIONS: str(N_QUESTIONS), PARAM_N_SKILLS: str(N_SKILLS)})
        publish_version(repo, preset, {"model.onnx": onnx[preset], **PYTHON_MODEL_FILES},
                        render_config(preset, options))


def flops_per_sample(model, feeds: dict[str, np.ndarray]) -> float:
    """FLOPs of one sample's eager forward (matmuls and attention, as torch counts them)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    rows = {k: torch.from_numpy(v[:4]) for k, v in feeds.items()}
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model(rows["questions"], rows["skills"], rows["responses"])
    return counter.get_total_flops() / 4


def peak_lines(results: dict[str, dict[str, float]], presets: list[str], levels: list[str],
               flops: dict[str, float], peak: float) -> list[str]:
    head = "| preset | MFLOP/sample | " + " | ".join(f"{level} GFLOP/s (% of peak)" for level in levels) + " |"
    lines = [f"\nfloat32 matmul peak (numpy 2048^2, this run): {peak:.0f} GFLOP/s", "", head,
             "|" + "---|" * (head.count("|") - 1)]
    for preset in presets:
        cells = []
        for level in levels:
            per_s = results[level][preset]
            cells.append(f"{per_s * flops[preset] / 1e9:.1f} ({100 * per_s * flops[preset] / 1e9 / peak:.0f}%)")
        lines.append(f"| {preset} | {flops[preset] / 1e6:.1f} | " + " | ".join(cells) + " |")
    return lines


def table(results: dict[str, dict[str, float]], presets: list[str], levels: list[str]) -> list[str]:
    reference = presets[0]
    head = ("| variant | preset | " + " | ".join(f"{level} samples/s | {level} ratio" for level in levels)
            + " | paper ratio |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for preset in presets:
        cells = []
        for level in levels:
            value = results[level].get(preset)
            cells += [f"{value:,.0f}" if value else "-",
                      f"{value / results[level][reference]:.2f}x" if value and results[level].get(reference) else "-"]
        lines.append(f"| {LABELS.get(preset, preset)} | {preset} | " + " | ".join(cells)
                     + f" | {PAPER_RATIO.get(preset, '-')} |")
    if "onnxruntime" in levels and "pytorch" in levels:
        ratios = [results["onnxruntime"][preset] / results["pytorch"][preset] for preset in presets]
        lines.append(f"\nonnxruntime / PyTorch eager: {min(ratios):.2f}x .. {max(ratios):.2f}x (target >= 2x)")
    if "onnxruntime-fused" in levels and "onnxruntime" in levels:
        lines.append("fused / plain graph (onnxruntime in-process): " + ", ".join(
            f"{preset} {results['onnxruntime-fused'][preset] / results['onnxruntime'][preset]:.2f}x"
            for preset in presets))
    if "triton" in levels and "onnxruntime" in levels:
        ratios = [results["triton"][preset] / results["onnxruntime"][preset] for preset in presets]
        lines.append(f"Triton / in-process onnxruntime: {min(ratios):.2f}x .. {max(ratios):.2f}x (target >= 0.8x)")
    return lines


def run(args: argparse.Namespace) -> int:
    import torch

    from routerkt.errors import UserError

    presets = [preset.strip() for preset in args.presets.split(",") if preset.strip()]
    levels = [level.strip() for level in args.levels.split(",") if level.strip()]
    if unknown := set(levels) - set(LEVELS):
        raise UserError(f"unknown level(s) {sorted(unknown)}; choose from {', '.join(LEVELS)}")
    if args.batch < 1 or not 2 <= args.seq_len or args.repeats < 1 or args.triton_requests < 1:
        raise UserError("--batch, --repeats and --triton-requests must be >= 1 and --seq-len >= 2")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    feeds = make_batch(args.batch, args.seq_len)
    work = Path(tempfile.mkdtemp(prefix="routerkt-throughput-"))
    models, onnx, runners, flops = _in_process_levels(args, presets, levels, feeds, work)
    with ExitStack() as stack:                  # closes the Triton clients, then stops Triton
        if "triton" in levels:
            build_repository(presets, models, onnx, work / "repository", args.batch, args.seq_len, args.threads)
            server = start_triton(stack, work / "repository", None)
            for preset in presets:
                runners[("triton", preset)] = TritonLevel(server.grpc_url, preset, args.triton_requests)
                stack.callback(runners[("triton", preset)].close)
        peak = matmul_peak_gflops()
        samples = _interleaved(runners, [(level, preset) for preset in presets for level in levels], feeds, args)
    results = {level: {preset: statistics.median(samples[(level, preset)]) for preset in presets} for level in levels}
    spread = {level: {preset: [min(samples[(level, preset)]), max(samples[(level, preset)])] for preset in presets}
              for level in levels}
    settings = {"batch": args.batch, "seq_len": args.seq_len, "repeats": args.repeats, "warmup": args.warmup,
                "threads": args.threads, "triton_requests": args.triton_requests, "machine": platform.processor()
                or platform.machine(), "cpus": __import__("os").cpu_count(), "torch": torch.__version__,
                "date": time.strftime("%Y-%m-%d")}
    out.mkdir(parents=True, exist_ok=True)
    (out / "throughput.json").write_text(json.dumps({**results, "spread": spread, "settings": settings,
                                                     "flops_per_sample": flops, "matmul_peak_gflops": peak},
                                                    indent=2) + "\n")
    lines = table(results, presets, levels) + peak_lines(results, presets, levels, flops, peak)
    (out / "throughput.md").write_text("\n".join(lines) + "\n")
    from training.plots import grouped_bars
    grouped_bars({level: {LABELS.get(preset, preset): results[level][preset] for preset in presets}
                  for level in levels}, out / "throughput_chart.png", "samples / s",
                 f"inference throughput, batch {args.batch}, length {args.seq_len}, {settings['cpus']} CPUs")
    print("\n".join(lines))
    print(f"\nwrote {out / 'throughput.json'}, {out / 'throughput.md'}, {out / 'throughput_chart.png'}")
    return 0


def _in_process_levels(args: argparse.Namespace, presets: list[str], levels: list[str],
                       feeds: dict[str, np.ndarray], work: Path) -> tuple[dict, dict, dict, dict]:
    """Per preset: the model (random weights, seed 0), its ONNX export (parity checked) in `work`, the
    runners of the in-process levels and its FLOPs per sample; (models, onnx paths, runners, flops)."""
    import torch

    from export.attention_fusion import fuse_attention_file
    from export.onnx_export import check_parity, export_onnx
    from training.models.registry import build_model, preset_config, with_vocab

    models, onnx, runners, flops = {}, {}, {}, {}
    for preset in presets:
        config = with_vocab(preset_config(preset), N_QUESTIONS, N_SKILLS)
        config.max_len = args.seq_len
        torch.manual_seed(0)
        models[preset] = build_model(config).eval()
        onnx[preset] = work / f"{preset}.onnx"
        export_onnx(models[preset], onnx[preset])
        parity = check_parity(models[preset], onnx[preset], shapes=((4, args.seq_len),))
        print(f"{preset}: exported, parity {parity.max_abs_diff:.1e}", file=sys.stderr)
        runners[("pytorch", preset)] = TorchLevel(models[preset])
        runners[("onnxruntime", preset)] = OrtLevel(onnx[preset], args.threads)
        if "onnxruntime-fused" in levels:
            fused = work / f"{preset}.fused.onnx"
            report = fuse_attention_file(onnx[preset], fused)
            parity = check_parity(models[preset], fused, shapes=((4, args.seq_len),))
            print(f"{preset}: {report.describe()}; parity {parity.max_abs_diff:.1e}", file=sys.stderr)
            runners[("onnxruntime-fused", preset)] = OrtLevel(fused, args.threads)
        flops[preset] = flops_per_sample(models[preset], feeds)
    return models, onnx, runners, flops


def _interleaved(runners: dict, keys: list[tuple[str, str]], feeds: dict[str, np.ndarray],
                 args: argparse.Namespace) -> dict[tuple[str, str], list[float]]:
    """`--warmup` calls of every (level, preset), then `--repeats` rounds visiting each once, in turn;
    samples/s of every timed call per (level, preset)."""
    for key in keys:
        for _ in range(args.warmup):
            runners[key](feeds)
    samples: dict[tuple[str, str], list[float]] = {key: [] for key in keys}
    for repeat in range(args.repeats):
        for key in keys:
            started = time.perf_counter()
            runners[key](feeds)
            samples[key].append(args.batch / (time.perf_counter() - started))
        print(f"repeat {repeat + 1}/{args.repeats} done", file=sys.stderr)
    return samples
