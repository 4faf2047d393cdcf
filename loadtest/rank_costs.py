"""`routerkt bench ranking --mastery`: what the rank path's calls cost through the gateway and a real
Triton, interleaved on one model version: Predict with 1 / 20 / 64 candidates, Mastery over every
skill of the vocabulary, and, when the version has the explain graph (explain.onnx):

- Predict with 1 / 20 candidates and `explain` (top_k 5);
- Predict with 1 / 20 candidates without `explain` on the same version exported without the explain
  graph: a temporary repository serves the version folder as `<name>` and, without explain.onnx and
  with its config's explain outputs removed (as exported before explanations), as
  `<name>-no-explain`. Aim: Predict without `explain` costs the same on both.

Every repetition visits every call once, in turn, so machine drift hits all alike. Prints p50 / p99
per call and its ratio to Predict with one candidate; writes OUT/rank_costs.json.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from loadtest.harness import READY_TIMEOUT_S, start_gateway, start_triton
from routerkt.atomic import atomic_write_json
from routerkt.contract.repository_reader import (latest_version, parse_triton_config, read_model_info, read_vocab,
                                          version_dir)
from routerkt.contract.signature import CONFIG_FILE, EXPLAIN_ONNX_FILE, RANK

NO_EXPLAIN = "-no-explain"          # suffix of the model name serving the version without its explain graph
NO_EXPLAIN_ROW = "predict {n}, version without explain graph"


def calls(pb, name: str, questions: list[int], window: int, plain: str | None) -> dict[str, tuple[str, object]]:
    """label -> (RPC name, request): a full history (window - 1) and candidates from the vocabulary;
    with `plain` (the model serving the version without its explain graph) the explain rows too."""
    history = [pb.Interaction(question_id=questions[(7 * i) % len(questions)], correct=i % 2)
               for i in range(window - 1)]

    def predict(n: int, model: str = name, **extra) -> object:
        return pb.PredictRequest(model=model, history=history, candidates=[
            pb.Candidate(question_id=questions[(11 * j) % len(questions)]) for j in range(n)], **extra)
    out = {f"predict {n}": ("Predict", predict(n)) for n in (1, 20, 64)}
    out["mastery, every skill"] = ("Mastery", pb.MasteryRequest(model=name, history=history))
    if plain:
        for n in (1, 20):
            out[f"predict {n} explain"] = ("Predict", predict(n, explain=pb.ExplainOptions(top_k=5)))
        for n in (1, 20):
            out[NO_EXPLAIN_ROW.format(n=n)] = ("Predict", predict(n, model=plain))
    return out


def with_and_without_explain(source: Path, name: str, version: int, out: Path) -> str:
    """A repository at `out` serving version `version` of `name` twice: as `name` (its folder and
    config as exported) and as the returned `name`-no-explain (no explain.onnx, and a config
    declaring the rank graph's outputs only: the same version as exported before explanations)."""
    from google.protobuf import text_format

    plain = f"{name}{NO_EXPLAIN}"
    text = (source / name / CONFIG_FILE).read_text(encoding="utf-8")
    config = parse_triton_config(text)
    config.name = plain
    kept = [o for o in config.output if o.name in RANK.output_names]
    del config.output[:]
    config.output.extend(kept)
    for served, dropped, config_text in ((name, (), text),
                                         (plain, (EXPLAIN_ONNX_FILE,), text_format.MessageToString(config))):
        shutil.copytree(version_dir(source, name, version), out / served / str(version),
                        ignore=shutil.ignore_patterns("__pycache__", *dropped))
        (out / served / CONFIG_FILE).write_text(config_text, encoding="utf-8")
    return plain


def warm_up(stub, requests: dict[str, tuple[str, object]], grpc) -> None:
    """Every call once (every shape), retried while a model is still loading (bounded)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    for method, request in requests.values():
        while True:
            try:
                getattr(stub, method)(request, timeout=30.0)
                break
            except grpc.RpcError as exc:
                if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND) \
                        or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


def run(args: argparse.Namespace, name: str) -> int:
    import grpc

    from serving.api import knowledge_tracing_pb2 as pb
    from serving.api import knowledge_tracing_pb2_grpc as pb_grpc

    version = latest_version(args.repository, name)
    info = read_model_info(args.repository, name, version)
    vocab = read_vocab(args.repository, name, version)
    explain = (version_dir(args.repository, name, version) / EXPLAIN_ONNX_FILE).is_file()
    args.out.mkdir(parents=True, exist_ok=True)
    times: dict[str, list[float]] = {}
    with ExitStack() as stack:
        repository, plain = args.repository, None
        if explain:
            repository = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="routerkt-rank-costs-"))) / "repo"
            plain = with_and_without_explain(args.repository, name, version, repository)
        triton = start_triton(stack, repository, args.out)
        target = start_gateway(stack, repository, name, triton.grpc_url)
        stub = pb_grpc.KnowledgeTracingServiceStub(stack.enter_context(grpc.insecure_channel(target)))
        requests = calls(pb, name, sorted(vocab.questions), info.window, plain)
        warm_up(stub, requests, grpc)
        print(f"rank costs: {name} v{version}, window {info.window}, {len(vocab.skills)} skills, "
              f"{args.repeats} repetitions" + ("" if explain else f"; no {EXPLAIN_ONNX_FILE}: no explain rows"),
              file=sys.stderr)
        for _ in range(args.repeats):
            for label, (method, request) in requests.items():
                started = time.perf_counter()
                getattr(stub, method)(request, timeout=30.0)
                times.setdefault(label, []).append(time.perf_counter() - started)
    base = float(np.percentile(times["predict 1"], 50))
    rows = [{"call": label, "p50_ms": float(np.percentile(v, 50)) * 1000, "p99_ms": float(np.percentile(v, 99)) * 1000,
             "vs_predict_1": float(np.percentile(v, 50)) / base} for label, v in times.items()]
    print("| call | p50 ms | p99 ms | p50 / Predict with 1 candidate |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['call']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['vs_predict_1']:.2f}x |")
    p50 = {r["call"]: r["p50_ms"] for r in rows}
    for n in (1, 20) if explain else ():
        with_graph, without = p50[f"predict {n}"], p50[NO_EXPLAIN_ROW.format(n=n)]
        print(f"Predict {n} without explain, version with / without the explain graph: p50 {with_graph:.2f} / "
              f"{without:.2f} ms ({with_graph / without:.2f}x)")
    atomic_write_json(args.out / "rank_costs.json", {"model": name, "version": version, "window": info.window,
                                                     "skills": len(vocab.skills), "repeats": args.repeats,
                                                     "explain_graph": explain,
                                                     "rows": rows, "date": time.strftime("%Y-%m-%dT%H:%M:%S")})
    print(f"wrote {args.out / 'rank_costs.json'}")
    return 0
