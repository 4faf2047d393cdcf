"""`routerkt bench fairness`: small Predict calls alone, then beside maximal PredictBatch calls, in one run.

The maximal calls are back-to-back legal PredictBatch calls (64 learners x 64 candidates x
1,000-interaction histories).

    routerkt bench fairness [--repository model_repository] [--model NAME] [--seconds 8] [--callers 4]
                            [--rounds 3] [--vary bulk_pause_ratio=0,2]

Starts Triton and a gateway (loopback), runs `--callers` threads of small Predicts (30-interaction
history, 1 candidate, 2 s deadline) for `--seconds` alone, then again while one thread sends
maximal batches; prints the small calls' p50 / p99, their failures and each batch's seconds.
`--vary SETTING=V1,V2,...` (a serving/settings.py field) compares values in one run: each gets its
own gateway (one Triton). `--rounds N` repeats the two phases N times, the gateways taking turns
each round, and ends with each gateway's pooled summary: p99 beside / p99 alone over all its
rounds, and that ratio per round (this machine's speed drifts, so one short pair of phases is a
noisy ratio).
"""
from __future__ import annotations

import argparse
import dataclasses
import threading
import time
from contextlib import ExitStack

import numpy as np

from loadtest.harness import add_common_flags, start_gateway, start_triton
from loadtest.learners import load_vocabulary
from routerkt.errors import UserError
from serving.settings import Settings


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_flags(p, "fairness")                  # Triton's log goes to --out
    p.add_argument("--seconds", type=float, default=8.0, help="length of each phase")
    p.add_argument("--callers", type=int, default=4, help="threads of small calls")
    p.add_argument("--rounds", type=int, default=3, help="alone + beside phase pairs per gateway, interleaved")
    p.add_argument("--vary", default="", metavar="SETTING=V1,V2",
                   help="a gateway setting (serving/settings.py) and the values to compare in one run (each: "
                        "its own gateway, both phases), e.g. bulk_pause_ratio=0,2; default: the defaults")


def phases(stub, big, small, callers: int, seconds: float):
    """Small calls alone, then beside back-to-back maximal batches: (phase, summary line, small-call
    latencies in s, maximal-batch seconds) each."""
    import grpc

    def smalls(out: list, failures: list) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.perf_counter()
            try:
                stub.Predict(small, timeout=2.0)
                out.append(time.perf_counter() - started)
            except grpc.RpcError as exc:
                failures.append(exc.code().name)
    for phase in ("alone", "beside maximal batches"):
        out, failures, batches = [], [], []
        threads = [threading.Thread(target=smalls, args=(out, failures)) for _ in range(callers)]
        for t in threads:
            t.start()
        if phase != "alone":
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                started = time.perf_counter()
                stub.PredictBatch(big, timeout=60.0)
                batches.append(time.perf_counter() - started)
        for t in threads:
            t.join()
        line = (f"{len(out)} small calls, p50 {np.percentile(out, 50) * 1e3:.1f} ms, "
                f"p99 {np.percentile(out, 99) * 1e3:.1f} ms, {len(failures)} failed")
        if batches:
            line += f"; {len(batches)} maximal batches, median {np.median(batches):.2f} s each"
        yield phase, line, out, batches


def pooled(rounds: list[dict]) -> str:
    """One gateway's summary over its rounds ({"alone": [...], "beside maximal batches": [...],
    "batches": [...]} each): pooled p99s, their ratio, the ratio per round, maximal batch median."""
    def p99(values) -> float:
        return float(np.percentile(values, 99)) * 1e3
    alone = [x for r in rounds for x in r["alone"]]
    beside = [x for r in rounds for x in r["beside maximal batches"]]
    per_round = ", ".join(f"{p99(r['beside maximal batches']) / p99(r['alone']):.2f}x" for r in rounds)
    batches = [x for r in rounds for x in r["batches"]]
    return (f"small p99 alone {p99(alone):.1f} ms, beside {p99(beside):.1f} ms: {p99(beside) / p99(alone):.2f}x "
            f"(per round {per_round}); {len(beside)} small calls beside; maximal batch median "
            f"{np.median(batches):.2f} s ({len(batches)} calls)")


def run(args: argparse.Namespace) -> int:
    import grpc

    from serving.api import knowledge_tracing_pb2 as pb
    from serving.api import knowledge_tracing_pb2_grpc as pb_grpc

    if args.seconds <= 0 or args.callers < 1 or args.rounds < 1:
        raise UserError("--seconds must be > 0, --callers and --rounds >= 1")
    vocabulary = load_vocabulary(args.repository, args.model)
    questions = vocabulary.questions
    history = [pb.Interaction(question_id=questions[i % len(questions)], correct=i % 2) for i in range(1000)]
    big = pb.PredictBatchRequest(model=vocabulary.model, learners=[pb.LearnerRequest(history=history, candidates=[
        pb.Candidate(question_id=questions[(3 * j) % len(questions)]) for j in range(64)]) for _ in range(64)])
    small = pb.PredictRequest(model=vocabulary.model, history=history[:30],
                              candidates=[pb.Candidate(question_id=questions[0])])
    args.out.mkdir(parents=True, exist_ok=True)
    name, values = parse_vary(args.vary)
    with ExitStack() as stack:
        triton = start_triton(stack, args.repository.resolve(), args.out)
        print(f"max batch: {big.ByteSize():,} bytes; {args.callers} small callers, {args.seconds:g} s per phase, "
              f"{args.rounds} round(s)")
        gateways = []
        for value in values:
            overrides = {name: value} if name else {}
            target = start_gateway(stack, args.repository.resolve(), vocabulary.model, triton.grpc_url, **overrides)
            stub = pb_grpc.KnowledgeTracingServiceStub(stack.enter_context(grpc.insecure_channel(target)))
            stub.PredictBatch(big, timeout=60.0)                   # warm-up
            gateways.append((f"{name} {value}" if name else "defaults", stub, []))
        for round_ in range(args.rounds):
            for label, stub, rounds in gateways:
                record: dict = {"batches": []}
                for phase, line, latencies, batches in phases(stub, big, small, args.callers, args.seconds):
                    print(f"round {round_ + 1}, {label}, {phase}: {line}", flush=True)
                    record[phase] = latencies
                    record["batches"] += batches
                rounds.append(record)
        for label, _, rounds in gateways:
            print(f"{label}, pooled over {len(rounds)} round(s): {pooled(rounds)}")
    return 0


def parse_vary(spec: str) -> tuple[str, list]:
    """`NAME=V1,V2` -> (NAME, [values typed like the Settings field]); empty -> ("", [None])."""
    if not spec.strip():
        return "", [None]
    name, sep, values = spec.partition("=")
    name = name.strip()
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    if not sep or name not in fields or fields[name].type not in ("int", "float"):
        raise UserError(f"--vary: SETTING=V1,V2 with a numeric setting of serving/settings.py, got {spec!r}")
    kind = int if fields[name].type == "int" else float
    try:
        parsed = [kind(v) for v in values.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"--vary: the values of {name} must be {kind.__name__}s, got {values!r}") from None
    if not parsed:
        raise UserError(f"--vary: no values for {name}")
    return name, parsed
