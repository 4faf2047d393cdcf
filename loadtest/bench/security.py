"""`routerkt bench security`: the cost of TLS + API keys, and of the failed-key limit to authorised callers.

One Triton, three in-process gateways over it: `plain`; `secure`, which serves TLS (a certificate
made for this run with the `openssl` command, under OUT/pki) and checks an API key (a `predict`
key issued into OUT/pki/keys.jsonl) with the limit on failed keys off; and `limited`, the same with
the limit on (Settings defaults: 20 failures per address and key id, 1 a second back;
serving/security/failures.py). Callers send stateless Predict calls (a 50-interaction history, 4
candidates) for --seconds per phase; the phases rotate plain / secure / limited for --rounds
rounds at each caller count, so machine noise falls on all alike. During the secure and limited
phases --attackers more threads send Predict with a wrong key, back to back, from the same address
as the authorised callers (the limit answers them RESOURCE_EXHAUSTED; the secure gateway
UNAUTHENTICATED). Each caller holds its own channel (the TLS handshake is paid once per channel, as
a client with a pooled channel does). Prints p50 / p99 / calls per second per mode, the ratios to
plain and limited/secure, and the spread of the per-round p50s; writes OUT/security.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from loadtest.harness import add_common_flags, start_gateway, start_triton, stop_children_on_sigterm
from loadtest.learners import load_vocabulary
from routerkt.errors import UserError

MODES = ("plain", "secure", "limited")
KEYED = ("secure", "limited")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_flags(p, "security")
    p.add_argument("--callers", default="1,32", help="comma-separated caller counts")
    p.add_argument("--seconds", type=float, default=5.0, help="length of one phase")
    p.add_argument("--rounds", type=int, default=3, help="plain/secure/limited rotations per caller count")
    p.add_argument("--attackers", type=int, default=1,
                   help="threads sending wrong keys during the secure and limited phases (0: none)")


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(folder: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate for 127.0.0.1, its key), made with openssl."""
    if shutil.which("openssl") is None:
        raise UserError("routerkt bench security needs the openssl command")
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key, cert, key = (folder / n for n in ("ca.pem", "ca.key", "server.pem", "server.key"))
    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *curve, "-keyout", str(ca_key), "-out", str(ca), "-days", "1", "-subj", "/CN=bench-ca")
    (folder / "server.ext").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _openssl("req", *curve, "-keyout", str(key), "-out", str(folder / "server.csr"), "-subj", "/CN=127.0.0.1")
    _openssl("x509", "-req", "-in", str(folder / "server.csr"), "-CA", str(ca), "-CAkey", str(ca_key),
             "-set_serial", "1", "-out", str(cert), "-days", "1", "-extfile", str(folder / "server.ext"))
    return ca, cert, key


def _phase(channels: list, request, seconds: float, attackers: list | None = None) -> tuple[list[float], float, dict]:
    """Every channel's caller sends `request` back to back for `seconds` while each `attackers`
    channel sends it with a wrong key; (latencies in ms, calls/s, the attackers' status counts)."""
    import grpc
    from serving.api import knowledge_tracing_pb2_grpc as pb_grpc

    latencies: list[list[float]] = [[] for _ in channels]
    failures: list[str] = []
    refused: dict[str, int] = {}
    stop_at = time.monotonic() + seconds

    def caller(i: int) -> None:
        stub = pb_grpc.KnowledgeTracingServiceStub(channels[i])
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            try:
                stub.Predict(request, timeout=10)
            except Exception as exc:          # counted as a failure, never silently timed
                failures.append(type(exc).__name__)
                return
            latencies[i].append((time.perf_counter() - started) * 1000)

    def attacker(channel) -> None:
        stub = pb_grpc.KnowledgeTracingServiceStub(channel)
        while time.monotonic() < stop_at:
            try:
                stub.Predict(request, timeout=10)
                code = "OK"
            except grpc.RpcError as exc:
                code = exc.code().name
            refused[code] = refused.get(code, 0) + 1

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(len(channels))]
    threads += [threading.Thread(target=attacker, args=(channel,)) for channel in attackers or ()]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise UserError(f"{len(failures)} calls failed ({failures[0]}); the benchmark counts only successes")
    flat = [x for per in latencies for x in per]
    return flat, len(flat) / (time.monotonic() - started), refused


def run(args: argparse.Namespace) -> int:
    from serving.api import knowledge_tracing_pb2 as pb
    from serving.security.api_keys import issue_key

    callers = [int(c) for c in args.callers.split(",") if c.strip()]
    if not callers or min(callers) < 1 or args.seconds <= 0 or args.rounds < 1 or args.attackers < 0:
        raise UserError("--callers must list counts >= 1, --seconds > 0, --rounds >= 1 and --attackers >= 0")
    vocabulary = load_vocabulary(args.repository, args.model)
    questions = vocabulary.questions
    args.out.mkdir(parents=True, exist_ok=True)
    ca, cert, key = make_pki(args.out / "pki")
    keys = args.out / "pki" / "keys.jsonl"
    keys.unlink(missing_ok=True)
    token = issue_key(keys, "bench", ["predict"])
    request = pb.PredictRequest(model=vocabulary.model, history=[
        pb.Interaction(question_id=questions[i % len(questions)], correct=i % 2) for i in range(50)],
        candidates=[pb.Candidate(question_id=question) for question in questions[:4]])
    results: dict[int, dict[str, dict[str, list]]] = {}
    with ExitStack() as stack:
        stop_children_on_sigterm(stack)
        repository = args.repository.resolve()
        triton = start_triton(stack, repository, args.out)
        secure = {"tls_cert": cert, "tls_key": key, "api_keys": keys}
        targets = {"plain": start_gateway(stack, repository, vocabulary.model, triton.grpc_url),
                   "secure": start_gateway(stack, repository, vocabulary.model, triton.grpc_url, **secure,
                                           auth_failure_burst=0),
                   "limited": start_gateway(stack, repository, vocabulary.model, triton.grpc_url, **secure)}
        for count in callers:
            results[count] = _rotations(stack, args, targets, token, ca.read_bytes(), request, count)
    report = _print_table(results)
    (args.out / "security.json").write_text(json.dumps(
        {"callers": report, "seconds": args.seconds, "rounds": args.rounds, "attackers": args.attackers,
         "cpus": os.cpu_count(),
         "date": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=2) + "\n")
    return 0


def _rotations(stack: ExitStack, args: argparse.Namespace, targets: dict[str, str], token: str, ca_pem: bytes,
               request, count: int) -> dict[str, dict[str, list]]:
    """`count` callers per mode (and `--attackers` with a wrong key in the keyed ones), warmed up, then
    `--rounds` rotations of the three modes; per mode the latencies, rates, per-round p50 and the attackers'
    status counts."""
    from serving.client import connect

    wrong = token.split(".", 1)[0] + ".not-the-secret"
    channels = {"plain": [connect(targets["plain"]) for _ in range(count)],
                **{mode: [connect(targets[mode], api_key=token, tls_ca=ca_pem) for _ in range(count)]
                   for mode in KEYED}}
    attackers = {mode: [connect(targets[mode], api_key=wrong, tls_ca=ca_pem) for _ in range(args.attackers)]
                 for mode in KEYED}
    for mode in MODES:
        for channel in channels[mode] + attackers.get(mode, []):
            stack.callback(channel.close)
        _phase(channels[mode], request, 1.0)                       # warm-up: handshakes, first calls
    collected: dict[str, dict] = {mode: {"ms": [], "rate": [], "round_p50": [], "attackers": {}} for mode in MODES}
    print(f"{count} caller(s), {args.attackers} attacker(s) in the keyed phases: {args.rounds} rounds of "
          f"{args.seconds:g} s per mode, rotating", file=sys.stderr)
    for round_ in range(args.rounds):
        for mode in MODES[round_ % 3:] + MODES[:round_ % 3]:
            latencies, rate, refused = _phase(channels[mode], request, args.seconds, attackers.get(mode))
            collected[mode]["ms"].extend(latencies)
            collected[mode]["rate"].append(rate)
            collected[mode]["round_p50"].append(float(np.percentile(latencies, 50)))
            for code, calls in refused.items():
                collected[mode]["attackers"][code] = collected[mode]["attackers"].get(code, 0) + calls
    return collected


def _print_table(results: dict[int, dict[str, dict[str, list]]]) -> dict[str, dict]:
    """Prints the table (and limited/secure per caller count on stderr); the report per caller count."""
    report = {}
    print("| callers | mode | p50 ms | p99 ms | calls/s | p50 / plain | calls/s / plain | per-round p50 ms | "
          "wrong-key calls answered |")
    print("|---|---|---|---|---|---|---|---|---|")
    for count, modes in results.items():
        row = {mode: {"p50_ms": float(np.percentile(modes[mode]["ms"], 50)),
                      "p99_ms": float(np.percentile(modes[mode]["ms"], 99)),
                      "calls_per_s": float(np.mean(modes[mode]["rate"])), "calls": len(modes[mode]["ms"]),
                      "round_p50_ms": modes[mode]["round_p50"], "attackers": modes[mode]["attackers"]}
               for mode in MODES}
        for mode in MODES:
            cell = row[mode]
            p50_ratio = cell["p50_ms"] / row["plain"]["p50_ms"]
            rate_ratio = cell["calls_per_s"] / row["plain"]["calls_per_s"]
            rounds = ", ".join(f"{p50:.2f}" for p50 in cell["round_p50_ms"])
            answered = ", ".join(f"{code} {calls}" for code, calls in sorted(cell["attackers"].items())) or "-"
            print(f"| {count} | {mode} | {cell['p50_ms']:.2f} | {cell['p99_ms']:.2f} | {cell['calls_per_s']:.0f} | "
                  f"{p50_ratio:.2f} | {rate_ratio:.2f} | {rounds} | {answered} |")
        limited_over_secure = row["limited"]["p50_ms"] / row["secure"]["p50_ms"]
        print(f"{count} caller(s): p50 limited/secure {limited_over_secure:.3f}", file=sys.stderr)
        report[str(count)] = {**row, "p50_secure_over_plain": row["secure"]["p50_ms"] / row["plain"]["p50_ms"],
                              "rate_secure_over_plain": row["secure"]["calls_per_s"] / row["plain"]["calls_per_s"],
                              "p50_limited_over_secure": limited_over_secure}
    return report
