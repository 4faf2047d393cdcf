"""`routerkt bench cost`: what one Predict costs at each layer and the Triton settings that cut it, in one run.

    routerkt bench cost [--repository model_repository] [--model NAME] [--candidates 1]
                        [--queue-delays 0,100,500,2000] [--ort-threads 1,2] [--callers 1,8,32]
                        [--seconds 5] [--rounds 2] [--out bench/cost]

One request shape (a full history of window - 1 interactions, `--candidates` candidates) measured at
three levels:
  onnxruntime  the served rank graph in this process (spinning off, `--ort-threads` intra-op
               threads): batch-1 latency, and samples/s at batch 512 (512 learners, one candidate);
  triton       tritonclient gRPC straight to Triton, `--callers` threads back to back;
  gateway      a `routerkt serve` process (no session store) over that Triton, stateless Predict.
Every Triton setting (`--queue-delays` x `--ort-threads`: a copy of the repository with those two
values in config.pbtxt) runs as its own tritonserver + gateway at once, and the phases are
interleaved round by round (setting, callers, level), so machine drift hits every cell alike.
The same run measures the CPU's float32 matmul peak (numpy, 2048^2) to put samples/s against.
Writes OUT/cost.json and prints the table; the chosen settings live in export/triton_config.py.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from export.triton_config import PARAM_ORT_INTRA_OP_THREADS
from loadtest.closed_loop import run_phase, summary
from loadtest.harness import add_common_flags, gateway_over, start_triton, stop_children_on_sigterm, wait_replicas
from loadtest.learners import load_vocabulary
from loadtest.timing import matmul_peak_gflops, timed
from routerkt.atomic import atomic_write_json
from routerkt.errors import UserError

CALL_TIMEOUT_S = 10.0
LEVELS = ("triton", "gateway")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_flags(p, "cost")
    p.add_argument("--candidates", type=int, default=1, help="candidates per request")
    p.add_argument("--queue-delays", default="0,100,500,2000", help="dynamic batcher max_queue_delay_us values")
    p.add_argument("--ort-threads", default="1,2", help="onnxruntime intra-op threads per Triton instance")
    p.add_argument("--callers", default="1,8,32", help="concurrent caller threads per phase")
    p.add_argument("--seconds", type=float, default=5.0, help="length of each phase")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds (results pooled)")


def _ints(text: str, flag: str, low: int) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < low:
        raise UserError(f"{flag} needs integers >= {low}, got {text!r}")
    return values


def setting_repository(source: Path, model: str, out: Path, delay_us: int, threads: int) -> Path:
    """A copy of `source` holding only `model`, with the two settings replaced in its config.pbtxt."""
    repo = out / f"repo-d{delay_us}-t{threads}"
    if repo.exists():
        shutil.rmtree(repo)
    shutil.copytree(source / model, repo / model, ignore=shutil.ignore_patterns("__pycache__"))
    path = repo / model / "config.pbtxt"
    config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    if not config.HasField("dynamic_batching") or PARAM_ORT_INTRA_OP_THREADS not in config.parameters:
        raise UserError(f"{path}: expected a dynamic_batching block and the {PARAM_ORT_INTRA_OP_THREADS} parameter "
                        "(re-export with `routerkt export`)")
    config.dynamic_batching.max_queue_delay_microseconds = delay_us
    config.parameters[PARAM_ORT_INTRA_OP_THREADS].string_value = str(threads)
    path.write_text(f"# routerkt bench cost: max_queue_delay_microseconds {delay_us}, "
                    f"{PARAM_ORT_INTRA_OP_THREADS} {threads}\n" + text_format.MessageToString(config))
    return repo


def rank_feeds(repository: Path, request, name: str, version: int):
    """(model version, the rank graph's inputs for `request`) encoded exactly as the gateway does
    (validation, vocabulary mapping, candidate padding: serving/encoder/window.py)."""
    from serving.core.catalog import ModelCatalog
    from serving.encoder.window import WindowEncoder
    from serving.transport.grpc_api import predict_query
    from serving.settings import Settings
    from serving.core.validation import validate_query

    catalog = ModelCatalog(repository)
    catalog.refresh()
    model = catalog.get(name, version)
    encoder = WindowEncoder()
    learner = validate_query(predict_query(request), Settings(repository=repository))[0]
    return model, encoder.inferences([encoder.encode(learner, model)], model, 1)[0].feeds


def ort_level(rank_path: Path, feeds: dict[str, np.ndarray], threads: int) -> dict:
    """In-process onnxruntime on the rank graph: batch-1 p50 and batch-512 samples/s."""
    from routerkt.contract import signature
    from routerkt.contract.onnx_session import cpu_session

    session = cpu_session(rank_path, threads=threads)
    for _ in range(20):
        session.run([signature.CANDIDATE_PROBS], feeds)
    times = [timed(lambda: session.run([signature.CANDIDATE_PROBS], feeds)) for _ in range(300)]
    big = {k: np.repeat(v, 512, axis=0) for k, v in feeds.items()}                  # feeds are [1, ...]
    session.run([signature.CANDIDATE_PROBS], big)
    best = min(timed(lambda: session.run([signature.CANDIDATE_PROBS], big)) for _ in range(5))
    return {"batch1_p50_ms": statistics.median(times) * 1e3, "batch512_samples_per_s": 512 / best}


def run(args: argparse.Namespace) -> int:
    from routerkt.contract import signature
    from serving.api import knowledge_tracing_pb2 as pb

    delays = _ints(args.queue_delays, "--queue-delays", 0)
    threads_list = _ints(args.ort_threads, "--ort-threads", 1)
    callers_list = _ints(args.callers, "--callers", 1)
    if args.seconds <= 0 or args.rounds < 1 or args.candidates < 1:
        raise UserError("--seconds must be > 0, --rounds and --candidates >= 1")
    vocabulary = load_vocabulary(args.repository, args.model)
    source, out = args.repository.resolve(), args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    version_dir = source / vocabulary.model / str(vocabulary.version)
    rank_path = version_dir / signature.RANK_ONNX_FILE
    if not rank_path.is_file():
        raise UserError(f"{rank_path} not found: this benchmark needs the rank graph (re-export the model)")
    window = int(json.loads((version_dir / signature.INFO_FILE).read_text())["window"])
    questions = vocabulary.questions
    request = pb.PredictRequest(
        model=vocabulary.model,
        candidates=[pb.Candidate(question_id=questions[(3 * j) % len(questions)]) for j in range(args.candidates)],
        history=[pb.Interaction(question_id=questions[(7 * i) % len(questions)], correct=i % 2)
                 for i in range(window - 1)])
    _, feeds = rank_feeds(source, request, vocabulary.model, vocabulary.version)

    print(f"model {vocabulary.model} v{vocabulary.version}, history {window - 1}, {args.candidates} candidate(s); "
          f"{os.cpu_count()} CPUs", file=sys.stderr)
    peak = matmul_peak_gflops()
    ort = {threads: ort_level(rank_path, feeds, threads) for threads in threads_list}
    settings = [(delay, threads) for threads in threads_list for delay in delays]
    with ExitStack() as stack:
        stop_children_on_sigterm(stack)
        calls = {setting: _setting_calls(stack, source, out, vocabulary, setting, request, feeds)
                 for setting in settings}
        cells = _interleaved(calls, settings, callers_list, args.rounds, args.seconds)
    results = {f"{level} d{delay} t{threads} c{callers}": summary(*cells[(delay, threads, callers, level)])
               for delay, threads in settings for callers in callers_list for level in LEVELS}
    report = {"model": vocabulary.model, "version": vocabulary.version, "matmul_peak_gflops": peak,
              "onnxruntime": {str(threads): level for threads, level in ort.items()}, "results": results,
              "settings": {"candidates": args.candidates, "history": window - 1, "seconds": args.seconds,
                           "rounds": args.rounds, "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%dT%H:%M:%S")}}
    atomic_write_json(out / "cost.json", report)
    print(format_report(report, settings, callers_list))
    print(f"wrote {out / 'cost.json'}")
    return 1 if any(r["failures"] for r in results.values()) else 0


def _setting_calls(stack: ExitStack, source: Path, out: Path, vocabulary, setting: tuple[int, int], request,
                   feeds: dict[str, np.ndarray]) -> dict[str, Callable[[], object]]:
    """A Triton over a copy of the repository with `setting` (queue delay us, onnxruntime threads) and a
    gateway over it, both warmed up; the call of each level: Triton's rank inference, the gateway's Predict."""
    import tritonclient.grpc as triton_grpc

    from routerkt.contract import signature
    from serving.api import knowledge_tracing_pb2_grpc as service
    from serving.client import connect

    delay, threads = setting
    repo = setting_repository(source, vocabulary.model, out, delay, threads)
    name = f"d{delay}-t{threads}"
    triton = start_triton(stack, repo, out, f"triton-{name}")
    gateway = gateway_over(repo, triton.grpc_url, out / f"gateway-{name}").start()
    stack.callback(gateway.stop)
    wait_replicas(gateway, 1)
    client = triton_grpc.InferenceServerClient(triton.grpc_url)
    stack.callback(client.close)
    inputs = []
    for spec in signature.RANK.inputs:
        tensor = triton_grpc.InferInput(spec.name, list(feeds[spec.name].shape), spec.onnx_dtype)
        tensor.set_data_from_numpy(feeds[spec.name])
        inputs.append(tensor)
    stub = service.KnowledgeTracingServiceStub(stack.enter_context(connect(gateway.address)))
    model, version = vocabulary.model, str(vocabulary.version)
    calls = {"triton": lambda: client.infer(model, inputs, model_version=version, client_timeout=CALL_TIMEOUT_S),
             "gateway": lambda: stub.Predict(request, timeout=CALL_TIMEOUT_S)}
    for call in calls.values():                       # warm-up: connections, first inferences
        for _ in range(20):
            call()
    print(f"setting {name}: ready", file=sys.stderr)
    return calls


Cell = tuple[list[float], list[str], float]             # pooled (latencies, failures, wall seconds)


def _interleaved(calls: dict[tuple[int, int], dict[str, Callable[[], object]]], settings: list[tuple[int, int]],
                 callers_list: list[int], rounds: int, seconds: float) -> dict[tuple, Cell]:
    """Every (setting, callers, level) phase once per round, in turn; per (delay, threads, callers, level)
    the pooled (latencies, failures, wall seconds)."""
    cells: dict[tuple, Cell] = {}
    for round_ in range(rounds):
        for setting in settings:
            for callers in callers_list:
                for level in LEVELS:
                    latencies, failures, wall = run_phase(calls[setting][level], callers, seconds)
                    pooled = cells.get((*setting, callers, level), ([], [], 0.0))
                    cells[(*setting, callers, level)] = (pooled[0] + latencies, pooled[1] + failures,
                                                         pooled[2] + wall)
        print(f"round {round_ + 1}/{rounds} done", file=sys.stderr)
    return cells


def format_report(report: dict, settings: list[tuple[int, int]], callers_list: list[int]) -> str:
    lines = [f"float32 matmul peak (numpy 2048^2): {report['matmul_peak_gflops']:.0f} GFLOP/s"]
    for threads, level in report["onnxruntime"].items():
        lines.append(f"onnxruntime in-process, {threads} thread(s): batch 1 p50 {level['batch1_p50_ms']:.2f} ms, "
                     f"batch 512 {level['batch512_samples_per_s']:.0f} samples/s")
    head = f"{'delay us':>8} {'threads':>7} {'callers':>7} | {'triton/s':>8} {'p50':>6} {'p99':>6} | " \
           f"{'gateway/s':>9} {'p50':>6} {'p99':>6} | {'gw/triton':>9} {'gw p50/ort':>10}"
    lines += [head, "-" * len(head)]
    for delay, threads in settings:
        ort_p50 = report["onnxruntime"][str(threads)]["batch1_p50_ms"]
        for callers in callers_list:
            triton, gateway = (report["results"][f"{level} d{delay} t{threads} c{callers}"] for level in LEVELS)
            ratio = gateway["calls_per_s"] / triton["calls_per_s"] if triton["calls_per_s"] else float("nan")
            over = (gateway["p50_ms"] or float("nan")) / ort_p50
            lines.append(f"{delay:>8} {threads:>7} {callers:>7} | {triton['calls_per_s']:>8.1f} "
                         f"{triton['p50_ms'] or 0:>6.1f} {triton['p99_ms'] or 0:>6.1f} | "
                         f"{gateway['calls_per_s']:>9.1f} {gateway['p50_ms'] or 0:>6.1f} "
                         f"{gateway['p99_ms'] or 0:>6.1f} | {ratio:>8.2f}x {over:>9.2f}x")
    return "\n".join(lines)
