"""`routerkt bench outcomes`: what outcome tracking costs, tracking on and off side by side.

One Triton, two in-process gateways with their own SQLite stores, identical except for
settings.track_outcomes. One caller walks simulated learners: Predict by learner_id (4
candidates), then Observe the answer to the first candidate; plus a stateless Predict (history
in the request; with tracking it also gets a prediction_id). The two gateways are called in
alternation, call for call, so machine noise falls on both alike. Prints p50 / p99 per RPC and the
on/off ratio; writes OUT/outcomes.json.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from contextlib import ExitStack

import numpy as np

from loadtest.harness import add_common_flags, start_gateway, start_triton
from loadtest.learners import load_vocabulary
from routerkt.errors import UserError

RPCS = ("Predict (by learner_id)", "Observe", "Predict (stateless)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_flags(p, "outcomes")
    p.add_argument("--rounds", type=int, default=400, help="learner steps per gateway")
    p.add_argument("--learners", type=int, default=50)


def run(args: argparse.Namespace) -> int:
    import grpc

    from serving.api import knowledge_tracing_pb2 as pb
    from serving.api import knowledge_tracing_pb2_grpc as pb_grpc

    if args.rounds < 10 or args.learners < 1:
        raise UserError("--rounds must be >= 10 and --learners >= 1")
    vocabulary = load_vocabulary(args.repository, args.model)
    questions = vocabulary.questions
    args.out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, dict[str, list[float]]] = {mode: {rpc: [] for rpc in RPCS} for mode in ("on", "off")}
    with ExitStack() as stack:
        repository = args.repository.resolve()
        triton = start_triton(stack, repository, args.out)
        stubs = {}
        for mode in ("on", "off"):
            store = args.out / f"sessions-{mode}.sqlite3"
            for stale in args.out.glob(f"sessions-{mode}.sqlite3*"):
                stale.unlink()
            target = start_gateway(stack, repository, vocabulary.model, triton.grpc_url, f"sqlite:///{store}",
                                   track_outcomes=mode == "on")
            channel = stack.enter_context(grpc.insecure_channel(target))
            stubs[mode] = pb_grpc.KnowledgeTracingServiceStub(channel)
        rng = random.Random(0)
        history = [pb.Interaction(question_id=questions[i % len(questions)], correct=i % 2) for i in range(50)]
        print(f"{args.rounds} rounds per gateway, tracking on and off in alternation", file=sys.stderr)
        for step in range(args.rounds + 10):                      # the first 10 rounds warm up
            asked = [rng.choice(questions) for _ in range(4)]
            correct = rng.randint(0, 1)
            learner = f"bench-learner-{rng.randrange(args.learners)}"
            for mode in (("on", "off") if step % 2 else ("off", "on")):
                stub = stubs[mode]
                calls = (
                    ("Predict (by learner_id)", lambda: stub.Predict(pb.PredictRequest(
                        model=vocabulary.model, learner_id=learner,
                        candidates=[pb.Candidate(question_id=q) for q in asked]), timeout=10)),
                    ("Observe", lambda: stub.Observe(pb.ObserveRequest(learner_id=learner, events=[pb.Event(
                        event_id=f"{mode}-{step}", question_id=asked[0], correct=correct)]), timeout=10)),
                    ("Predict (stateless)", lambda: stub.Predict(pb.PredictRequest(
                        model=vocabulary.model, history=history, candidates=[pb.Candidate(question_id=asked[0])]),
                        timeout=10)),
                )
                for rpc, call in calls:
                    started = time.perf_counter()
                    call()
                    if step >= 10:
                        timings[mode][rpc].append((time.perf_counter() - started) * 1000)
    report = {}
    print("| RPC | p50 off ms | p50 on ms | p50 on/off | p99 off ms | p99 on ms |")
    print("|---|---|---|---|---|---|")
    for rpc in RPCS:
        off, on = (np.percentile(timings[m][rpc], [50, 99]) for m in ("off", "on"))
        report[rpc] = {"p50_off_ms": off[0], "p50_on_ms": on[0], "p99_off_ms": off[1], "p99_on_ms": on[1]}
        print(f"| {rpc} | {off[0]:.2f} | {on[0]:.2f} | {on[0] / off[0]:.2f} | {off[1]:.2f} | {on[1]:.2f} |")
    (args.out / "outcomes.json").write_text(json.dumps(
        {"rpcs": report, "rounds": args.rounds, "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%dT%H:%M:%S")},
        indent=2) + "\n")
    return 0
