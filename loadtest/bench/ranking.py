"""`routerkt bench ranking`: history-once ranking (rank graph) vs one window per candidate (score graph).

For N candidates, side by side in one interleaved run.

    routerkt bench ranking [--repository model_repository] [--model NAME] [--n 1,4,16,20,64]
                           [--repeats 30] [--threads 2] [--out bench/ranking] [--mastery]

With --mastery: the rank path's calls through the gateway instead (loadtest/rank_costs.py):
Predict with 1 / 20 / 64 candidates, Mastery over every skill, Predict with and without explain.

Two levels, on the latest version of the model (its real weights and vocabulary):
  onnxruntime  rank.onnx on [1, window-1] + [1, N] vs model.onnx on N windows [N, window], in process;
  gateway      Predict with N candidates through the gateway and a real Triton, against two Triton
               models built from the same version folder: `<name>` serving the rank graph and
               `<name>-windows` serving the score graph (the gateway's old path).
Every repetition visits every (N, method, level) once, in turn, so machine drift hits all alike.
Prints p50 / p99 latency and candidates/s per cell with the ratios, writes OUT/ranking.json and
OUT/ranking.png.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.harness import add_common_flags, start_gateway, start_triton
from routerkt.atomic import atomic_write_json
from routerkt.contract.onnx_session import cpu_session
from routerkt.contract.repository_reader import latest_version, list_models, read_model_info, read_vocab, version_dir
from routerkt.contract.signature import (CANDIDATE_PROBS, FIRST_ID, INFO_FILE, ONNX_FILE, PROBS, RANK,
                                         RANK_ONNX_FILE, SCORE, VOCAB_FILE)
from routerkt.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_flags(p, "ranking")
    p.add_argument("--n", default="1,4,16,20,64", help="candidate counts")
    p.add_argument("--repeats", type=int, default=30, help="interleaved repetitions per cell")
    p.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads (in process)")
    p.add_argument("--mastery", action="store_true", help="Mastery over every skill and explain vs Predict instead")


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def ort_inputs(window: int, n: int, n_questions: int, n_skills: int, rng: np.random.Generator):
    """(rank feeds, score feeds) for one learner with a full history and n candidates."""
    length = window - 1
    history_questions = rng.integers(FIRST_ID, n_questions, (1, length))
    history_skills = rng.integers(FIRST_ID, n_skills, (1, length))
    history_correct = rng.integers(0, 2, (1, length))
    candidate_questions = rng.integers(FIRST_ID, n_questions, (1, n))
    candidate_skills = rng.integers(FIRST_ID, n_skills, (1, n))
    # one-skill sets [1, length, 1], [1, n, 1]
    history_skills, candidate_skills = history_skills[..., None], candidate_skills[..., None]
    rank = dict(zip(RANK.input_names, (history_questions, history_skills, history_correct,
                                       candidate_questions, candidate_skills)))
    windows = (np.concatenate([np.repeat(history_questions, n, 0), candidate_questions.T], 1),
               np.concatenate([np.repeat(history_skills, n, 0), candidate_skills.transpose(1, 0, 2)], 1),
               np.concatenate([np.repeat(history_correct, n, 0), np.zeros((n, 1), np.int64)], 1))
    score = dict(zip(SCORE.input_names, windows))
    return {k: v.astype(np.int64) for k, v in rank.items()}, {k: v.astype(np.int64) for k, v in score.items()}


def two_model_repository(source: Path, name: str, version: int, out: Path) -> None:
    """`name` (rank graph) and `name`-windows (score graph), both from one version folder."""
    from export.repository import publish_version
    from export.triton_config import PARAM_N_QUESTIONS, PARAM_N_SKILLS, TritonModelOptions, render_config
    from export.triton_python_model import PYTHON_MODEL_FILES

    info = read_model_info(source, name, version)
    folder = version_dir(source, name, version)
    files = {f: folder / f for f in (ONNX_FILE, RANK_ONNX_FILE, VOCAB_FILE, INFO_FILE)}
    files.update(PYTHON_MODEL_FILES)
    for served, graph in ((name, RANK.name), (f"{name}-windows", SCORE.name)):
        options = TritonModelOptions(window=info.window, graph=graph, parameters={
            PARAM_N_QUESTIONS: str(info.n_questions), PARAM_N_SKILLS: str(info.n_skills)})
        publish_version(out, served, files, render_config(served, options), version=1)


def run(args: argparse.Namespace) -> int:
    counts = sorted({int(x) for x in args.n.split(",") if x.strip()})
    if not counts or counts[0] < 1 or counts[-1] > 64 or args.repeats < 3:
        raise UserError("--n must be candidate counts in 1..64 and --repeats >= 3")
    models = list_models(args.repository)
    name = args.model or (models[0] if len(models) == 1 else "")
    if name not in models:
        raise UserError(f"choose --model among {models} in {args.repository}")
    if args.mastery:
        from loadtest.rank_costs import run as run_rank_costs
        return run_rank_costs(args, name)
    version = latest_version(args.repository, name)
    info = read_model_info(args.repository, name, version)
    folder = version_dir(args.repository, name, version)
    if not (folder / RANK_ONNX_FILE).is_file():
        raise UserError(f"{folder} has no {RANK_ONNX_FILE}: re-export the model")
    times = _timed_calls(args, name, version, info, counts)
    rows = _rows(times, counts)
    _print_rows(rows, counts)
    atomic_write_json(args.out / "ranking.json", {"model": name, "version": version, "window": info.window,
                                                  "repeats": args.repeats, "threads": args.threads, "rows": rows,
                                                  "date": time.strftime("%Y-%m-%dT%H:%M:%S")})
    _plot(rows, counts, args.out / "ranking.png")
    print(f"wrote {args.out / 'ranking.json'} and {args.out / 'ranking.png'}")
    return 0


def _timed_calls(args: argparse.Namespace, name: str, version: int, info,
                 counts: list[int]) -> dict[tuple[str, str, int], list[float]]:
    """Seconds of every call per (level, method, N) of the model's `version` (`info`: its model_info):
    each repetition visits every (N, method, level) once, in turn; the gateway's level over a
    temporary two-model repository and its own Triton."""
    import grpc

    from serving.api import knowledge_tracing_pb2_grpc as service

    folder = version_dir(args.repository, name, version)
    rng = np.random.default_rng(0)
    sessions = {"rank": cpu_session(folder / RANK_ONNX_FILE, args.threads),
                "windows": cpu_session(folder / ONNX_FILE, args.threads)}
    feeds = {n: ort_inputs(info.window, n, info.n_questions, info.n_skills, rng) for n in counts}
    outputs = {"rank": CANDIDATE_PROBS, "windows": PROBS}
    times: dict[tuple[str, str, int], list[float]] = {}
    args.out.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="routerkt-ranking-")))
        two_model_repository(args.repository, name, version, tmp / "repo")
        triton = start_triton(stack, tmp / "repo", args.out)
        target = start_gateway(stack, tmp / "repo", name, triton.grpc_url)
        deadline = time.monotonic() + 120
        channel = stack.enter_context(grpc.insecure_channel(target))
        stub = service.KnowledgeTracingServiceStub(channel)
        requests = _predict_requests(args.repository, name, version, info.window, counts)
        while True:                                              # both Triton models answering
            try:
                for request in requests.values():
                    stub.Predict(request, timeout=30.0)
                break
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise UserError("the gateway did not serve both models within 120 s") from None
                time.sleep(0.5)
        print(f"ranking bench: {name} v{version}, window {info.window}, N {counts}, {args.repeats} repetitions",
              file=sys.stderr)
        for _ in range(args.repeats):
            for n in counts:
                for method in ("rank", "windows"):
                    started = time.perf_counter()
                    sessions[method].run([outputs[method]], feeds[n][0 if method == "rank" else 1])
                    times.setdefault(("onnxruntime", method, n), []).append(time.perf_counter() - started)
                    model = name if method == "rank" else f"{name}-windows"
                    started = time.perf_counter()
                    stub.Predict(requests[(model, n)], timeout=30.0)
                    times.setdefault(("gateway", method, n), []).append(time.perf_counter() - started)
    return times


def _predict_requests(repository: Path, name: str, version: int, window: int,
                      counts: list[int]) -> dict[tuple[str, int], Any]:
    """One Predict per (Triton model, N): a full history and N candidates, the same for both models."""
    from serving.api import knowledge_tracing_pb2 as pb

    questions = sorted(read_vocab(repository, name, version).questions)
    history = [pb.Interaction(question_id=questions[(7 * i) % len(questions)], correct=i % 2)
               for i in range(window - 1)]
    return {(model, n): pb.PredictRequest(model=model, history=history, candidates=[
        pb.Candidate(question_id=questions[(11 * j) % len(questions)]) for j in range(n)])
        for model in (name, f"{name}-windows") for n in counts}


def _rows(times: dict[tuple[str, str, int], list[float]], counts: list[int]) -> list[dict]:
    """Per level and N: p50 / p99 ms and candidates/s of both methods, and rank's speed-up."""
    rows = []
    for level in ("onnxruntime", "gateway"):
        for n in counts:
            cells = {method: times[(level, method, n)] for method in ("rank", "windows")}
            p50 = {method: percentile(values, 50) * 1000 for method, values in cells.items()}
            p99 = {method: percentile(values, 99) * 1000 for method, values in cells.items()}
            per_s = {method: n / statistics.mean(values) for method, values in cells.items()}
            rows.append({"level": level, "n": n, "p50_ms": p50, "p99_ms": p99, "candidates_per_s": per_s,
                         "speedup": per_s["rank"] / per_s["windows"]})
    return rows


def _print_rows(rows: list[dict], counts: list[int]) -> None:
    print("| level | N | rank p50 / p99 ms | windows p50 / p99 ms | rank cand/s | windows cand/s | rank / windows |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        p50, p99, per_s = row["p50_ms"], row["p99_ms"], row["candidates_per_s"]
        print(f"| {row['level']} | {row['n']} | {p50['rank']:.2f} / {p99['rank']:.2f} | "
              f"{p50['windows']:.2f} / {p99['windows']:.2f} | {per_s['rank']:,.0f} | "
              f"{per_s['windows']:,.0f} | {row['speedup']:.1f}x |")
    for level in ("onnxruntime", "gateway"):
        base = next(row for row in rows if row["level"] == level and row["n"] == counts[0])["p50_ms"]["rank"]
        for row in rows:
            if row["level"] == level and row["n"] != counts[0]:
                print(f"{level}: rank p50 at N={row['n']} is {row['p50_ms']['rank'] / base:.2f}x "
                      f"that at N={counts[0]}")


def _plot(rows: list[dict], counts: list[int], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, level in zip(axes, ("onnxruntime", "gateway")):
        for method, style in (("rank", "o-"), ("windows", "s--")):
            ax.plot(counts, [r["p50_ms"][method] for r in rows if r["level"] == level], style, label=method)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("candidates N")
        ax.set_ylabel("p50 latency (ms)")
        ax.set_title(level)
        ax.legend()
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    shutil.move(tmp, path)
