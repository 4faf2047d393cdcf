"""`routerkt bench replicas`: one gateway over 1 Triton vs one over 2 Triton replicas, in one run.

The second gateway gets both replicas as `--triton-url A,B`; the two setups run side by side.

    routerkt bench replicas [--repository model_repository] [--model NAME] [--seconds 8] [--callers 8]
                            [--rounds 2] [--history 50] [--candidates 4] [--out bench/replicas]

Starts two tritonservers (A, B) and two `routerkt serve` processes (no session store): gateway 1
over A alone, gateway 2 over A and B. Then `--rounds` times, in turn, `--callers` threads send
stateless Predicts (`--history` interactions, `--candidates` candidates, 5 s deadline) back to back
for `--seconds` to gateway 1, then to gateway 2, so machine drift hits both alike. Prints calls/s,
p50 / p99 and failures per setup and the throughput ratio, and how gateway 2 split its inferences
over the replicas; writes OUT/replicas.json (Triton and gateway logs beside it). Every server runs
on this machine: with few cores the replicas share them, so expect a small ratio there.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from loadtest.closed_loop import run_phase, summary
from loadtest.harness import (GatewayProcess, add_common_flags, gateway_over, start_tritons, stop_children_on_sigterm,
                              wait_replicas)
from loadtest.learners import load_vocabulary
from routerkt.atomic import atomic_write_json
from routerkt.errors import UserError

CALL_TIMEOUT_S = 5.0
SETUPS = ("1 replica", "2 replicas")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_flags(p, "replicas")
    p.add_argument("--seconds", type=float, default=8.0, help="length of each phase")
    p.add_argument("--callers", type=int, default=8, help="caller threads")
    p.add_argument("--rounds", type=int, default=2, help="phases per setup, interleaved")
    p.add_argument("--history", type=int, default=50, help="interactions in each Predict")
    p.add_argument("--candidates", type=int, default=4, help="candidates in each Predict")


def replica_inferences(gateway: GatewayProcess) -> dict[str, float]:
    """routerkt_triton_replica_inferences_total per replica index."""
    return {str(i): gateway.metric("routerkt_triton_replica_inferences_total", replica=str(i)) for i in range(2)}


def format_table(results: dict[str, dict]) -> str:
    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"
    lines = [f"{'setup':<12}{'calls':>8}{'failed':>8}{'calls/s':>10}{'p50 ms':>9}{'p99 ms':>9}"]
    for setup, r in results.items():
        lines.append(f"{setup:<12}{r['calls']:>8}{r['failures']:>8}{r['calls_per_s']:>10.1f}"
                     f"{cell(r['p50_ms']):>9}{cell(r['p99_ms']):>9}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from serving.api import knowledge_tracing_pb2 as pb

    if args.seconds <= 0 or args.callers < 1 or args.rounds < 1 or args.history < 0 or args.candidates < 1:
        raise UserError("--seconds must be > 0, --callers, --rounds and --candidates >= 1, --history >= 0")
    vocabulary = load_vocabulary(args.repository, args.model)
    repository = args.repository.resolve()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    questions = vocabulary.questions
    request = pb.PredictRequest(
        model=vocabulary.model,
        history=[pb.Interaction(question_id=questions[(7 * i) % len(questions)], correct=i % 2)
                 for i in range(args.history)],
        candidates=[pb.Candidate(question_id=questions[(3 * j) % len(questions)]) for j in range(args.candidates)])
    with ExitStack() as stack:
        stop_children_on_sigterm(stack)                          # SIGTERM: stop what we started, too
        gateways, stubs = _start_setups(stack, repository, out, request)
        print(f"model {vocabulary.model} v{vocabulary.version}; {args.callers} callers, {args.seconds:g} s per "
              f"phase, {args.rounds} round(s), Predict with {args.history} interactions and {args.candidates} "
              f"candidates; {os.cpu_count()} CPUs", file=sys.stderr)
        before = replica_inferences(gateways[SETUPS[1]])
        collected = _interleaved(stubs, request, args)
        after = replica_inferences(gateways[SETUPS[1]])
    results = {setup: summary(*collected[setup]) for setup in SETUPS}
    one, two = (results[setup]["calls_per_s"] for setup in SETUPS)
    ratio = two / one if one else None
    split = {replica: after.get(replica, 0.0) - before.get(replica, 0.0) for replica in sorted(after)}
    report = {"model": vocabulary.model, "version": vocabulary.version, "results": results,
              "throughput_ratio_2_vs_1": ratio, "two_replicas_inferences_per_replica": split,
              "settings": {"callers": args.callers, "seconds_per_phase": args.seconds, "rounds": args.rounds,
                           "history": args.history, "candidates": args.candidates, "cpus": os.cpu_count(),
                           "date": time.strftime("%Y-%m-%dT%H:%M:%S")}}
    atomic_write_json(out / "replicas.json", report)
    print(format_table(results))
    print(f"throughput 2 replicas / 1 replica: {ratio:.2f}x" if ratio else "throughput ratio: n/a")
    print("2 replicas, inferences per replica: " + ", ".join(f"{k}: {v:.0f}" for k, v in split.items()))
    print(f"wrote {out / 'replicas.json'}")
    return 1 if any(r["failures"] for r in results.values()) else 0


def _start_setups(stack: ExitStack, repository: Path, out: Path, request) -> tuple[dict[str, GatewayProcess], dict]:
    """Two Tritons, a gateway over the first alone and one over both, each with all its replicas ready and
    warmed up; (the gateways, their stubs) per setup."""
    import grpc

    from serving.api import knowledge_tracing_pb2_grpc as service
    from serving.client import connect

    tritons = start_tritons(stack, repository, out, ["triton-0", "triton-1"])
    gateways = {}
    for setup, urls in zip(SETUPS, (tritons[0].grpc_url, ",".join(triton.grpc_url for triton in tritons))):
        gateway = gateway_over(repository, urls, out / f"gateway-{setup.split()[0]}").start()
        stack.callback(gateway.stop)
        gateways[setup] = gateway
    for replicas, gateway in enumerate(gateways.values(), start=1):
        wait_replicas(gateway, replicas)
    stubs = {}
    for setup, gateway in gateways.items():
        channel = stack.enter_context(connect(gateway.address))
        stubs[setup] = service.KnowledgeTracingServiceStub(channel)
        try:
            for _ in range(20):                       # warm-up (connections, first inferences)
                stubs[setup].Predict(request, timeout=30.0)
        except grpc.RpcError as exc:
            raise UserError(f"warm-up Predict on the gateway ({setup}) failed: {exc.code().name}") from None
    return gateways, stubs


def _interleaved(stubs: dict, request, args: argparse.Namespace) -> dict[str, tuple[list[float], list[str], float]]:
    """`--rounds` rounds of one phase per setup, in turn; per setup the pooled (latencies, failures, wall s)."""
    collected: dict[str, tuple[list[float], list[str], float]] = {setup: ([], [], 0.0) for setup in SETUPS}
    for round_ in range(args.rounds):
        for setup in SETUPS:
            latencies, failures, wall = run_phase(
                lambda stub=stubs[setup]: stub.Predict(request, timeout=CALL_TIMEOUT_S), args.callers, args.seconds)
            all_latencies, all_failures, total = collected[setup]
            all_latencies.extend(latencies)
            all_failures.extend(failures)
            collected[setup] = (all_latencies, all_failures, total + wall)
            print(f"round {round_ + 1} {setup}: {len(latencies) / wall:.1f} calls/s, "
                  f"{len(failures)} failed", file=sys.stderr)
    return collected
