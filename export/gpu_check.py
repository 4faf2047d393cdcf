"""The GPU check to run once on a host with a CUDA GPU: parity of each exported model with PyTorch
on the GPU, and GPU throughput at batch 512, length 100.

    python -m export.gpu_check [--presets akt-standard,routerkt-akt,alibi-akt,relative-akt,akt] [--out DIR]

For each preset (random weights; speed and parity do not depend on them): export to ONNX, run the
batch through CPU onnxruntime (the reference), through PyTorch CUDA eager and through a captured
CUDA graph of the same forward; report max |GPU - CPU onnxruntime| and samples/s (CUDA events,
warm-up first, median of repeats). onnxruntime-gpu and TensorRT are used when importable.
Training on the device (train.device=cuda, training/device.py): one Adam step of the training loss
from the same weights on the device and on the CPU, and the largest parameter difference after it.
`--device cpu` runs the same script on a CPU-only host (eager only), which the test suite does.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from export.onnx_export import export_onnx
from routerkt.contract.onnx_session import cpu_session
from export.bench_inputs import DEFAULT_PRESETS, N_QUESTIONS, N_SKILLS, make_batch
from training.models.registry import build_model, preset_config, with_vocab


def timed(fn, repeats: int, device: str) -> list[float]:
    """Seconds per call, synchronised with the device."""
    out = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        out.append(time.perf_counter() - start)
    return out


def training_step_diff(cfg, feeds: dict[str, np.ndarray], device: str) -> float:
    """Max |parameter difference| after one Adam step (dropout off) on `device` vs on the CPU."""
    from training.batching import Batch
    from training.fold_training import batch_loss
    rows = min(64, len(feeds["questions"]))
    batch = Batch(*(torch.from_numpy(feeds[k][:rows]) for k in ("questions", "skills", "responses")),
                  index=np.arange(rows))
    stepped = []
    for where in ("cpu", device):
        torch.manual_seed(0)
        model = build_model(cfg).to(where).eval()               # eval: no dropout, the same function on both
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        loss, _ = batch_loss(model, batch)
        loss.backward()
        optimizer.step()
        stepped.append([p.detach().float().cpu() for p in model.parameters()])
    return max(float((a - b).abs().max()) for a, b in zip(*stepped))


def check(preset: str, batch: int, length: int, device: str, repeats: int, work: Path) -> dict:
    cfg = with_vocab(preset_config(preset), N_QUESTIONS, N_SKILLS)
    cfg.max_len = length
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    path = work / f"{preset}.onnx"
    export_onnx(model, path)
    feeds = make_batch(batch, length)
    reference = cpu_session(path).run(["probs"], feeds)[0]
    model = model.to(device)
    inputs = [torch.from_numpy(feeds[k]).to(device) for k in ("questions", "skills", "responses")]
    forward = lambda: torch.sigmoid(model(*inputs).logits)  # noqa: E731
    row = {"preset": preset, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
    with torch.inference_mode():
        for _ in range(3):
            eager = forward()
        row["eager_max_abs_diff_vs_ort_cpu"] = float(np.abs(eager.float().cpu().numpy() - reference).max())
        row["eager_samples_per_s"] = batch / statistics.median(timed(forward, repeats, device))
    row["train_step_max_param_diff_vs_cpu"] = training_step_diff(cfg, feeds, device)
    if device == "cuda":
        static = [t.clone() for t in inputs]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(3):                                   # warm-up on a side stream before capture
                torch.sigmoid(model(*static).logits)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), torch.inference_mode():
            captured = torch.sigmoid(model(*static).logits)
        graph.replay()
        torch.cuda.synchronize()
        row["graph_max_abs_diff_vs_ort_cpu"] = float(np.abs(captured.float().cpu().numpy() - reference).max())
        row["graph_samples_per_s"] = batch / statistics.median(timed(graph.replay, repeats, device))
    try:
        import onnxruntime as ort
        if "CUDAExecutionProvider" in ort.get_available_providers() and device == "cuda":
            sess = ort.InferenceSession(str(path), providers=["CUDAExecutionProvider"])
            if "CUDAExecutionProvider" in sess.get_providers():
                got = sess.run(["probs"], feeds)[0]
                row["ort_cuda_max_abs_diff_vs_ort_cpu"] = float(np.abs(got - reference).max())
                row["ort_cuda_samples_per_s"] = batch / statistics.median(
                    timed(lambda: sess.run(["probs"], feeds), repeats, "cpu"))
    except ImportError:
        pass
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default=",".join(DEFAULT_PRESETS))
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--seq-len", type=int, default=100)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    p.add_argument("--out", default="bench/gpu")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="routerkt-gpu-"))
    rows = [check(name.strip(), args.batch, args.seq_len, args.device, args.repeats, work)
            for name in args.presets.split(",") if name.strip()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(rows, indent=2) + "\n")
    keys = [k for k in rows[0] if k != "preset"]
    print("| preset | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for r in rows:
        print(f"| {r['preset']} | " + " | ".join(f"{r[k]:.3g}" if isinstance(r.get(k), float) else str(r.get(k, "-"))
                                              for k in keys) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
