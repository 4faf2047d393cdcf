"""`routerkt bench ranking --mastery`: what the rank path's calls cost through the gateway and a real
Triton, interleaved on one model version: Predict with 1 / 20 / 64 candidates, Mastery over every
skill of the vocabulary, and (when the version has the explain graph) Predict with `explain`.

Every repetition visits every call once, in turn, so machine drift hits all alike. Prints p50 / p99
per call and its ratio to Predict with one candidate; writes OUT/rank_costs.json.
"""
from __future__ import annotations

import argparse
import sys
import time
from contextlib import ExitStack

import numpy as np

from loadtest.harness import start_gateway, start_triton
from routerkt.atomic import atomic_write_json
from routerkt.contract.repository import latest_version, read_model_info, read_vocab


def calls(pb, name: str, questions: list[int], window: int, explain: bool) -> dict[str, tuple[str, object]]:
    """label -> (RPC name, request): a full history (window - 1) and candidates from the vocabulary."""
    history = [pb.Interaction(question_id=questions[(7 * i) % len(questions)], correct=i % 2)
               for i in range(window - 1)]

    def predict(n: int, **extra) -> object:
        return pb.PredictRequest(model=name, history=history, candidates=[
            pb.Candidate(question_id=questions[(11 * j) % len(questions)]) for j in range(n)], **extra)
    out = {f"predict {n}": ("Predict", predict(n)) for n in (1, 20, 64)}
    out["mastery, every skill"] = ("Mastery", pb.MasteryRequest(model=name, history=history))
    if explain:
        out["predict 1 explain"] = ("Predict", predict(1, explain=pb.ExplainOptions(top_k=5)))
        out["predict 20 explain"] = ("Predict", predict(20, explain=pb.ExplainOptions(top_k=5)))
    return out


def run(args: argparse.Namespace, name: str) -> int:
    import grpc

    from serving.api import knowledge_tracing_pb2 as pb
    from serving.api import knowledge_tracing_pb2_grpc as pb_grpc

    version = latest_version(args.repository, name)
    info = read_model_info(args.repository, name, version)
    vocab = read_vocab(args.repository, name, version)
    explain = False
    args.out.mkdir(parents=True, exist_ok=True)
    times: dict[str, list[float]] = {}
    with ExitStack() as stack:
        triton = start_triton(stack, args.repository, args.out)
        target = start_gateway(stack, args.repository, name, triton.grpc_url)
        stub = pb_grpc.KnowledgeTracingServiceStub(stack.enter_context(grpc.insecure_channel(target)))
        requests = calls(pb, name, sorted(vocab.questions), info.window, explain)
        for method, request in requests.values():                 # warm-up: every shape once
            getattr(stub, method)(request, timeout=30.0)
        print(f"rank costs: {name} v{version}, window {info.window}, {len(vocab.skills)} skills, "
              f"{args.repeats} repetitions", file=sys.stderr)
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
    atomic_write_json(args.out / "rank_costs.json", {"model": name, "version": version, "window": info.window,
                                                     "skills": len(vocab.skills), "repeats": args.repeats,
                                                     "rows": rows, "date": time.strftime("%Y-%m-%dT%H:%M:%S")})
    print(f"wrote {args.out / 'rank_costs.json'}")
    return 0
