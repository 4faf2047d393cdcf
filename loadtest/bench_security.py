"""`routerkt bench security`: what TLS + API-key authentication cost, against a plain gateway, side by side.

One Triton, two in-process gateways over it, identical except that one serves TLS (a certificate
made for this run with the `openssl` command, under OUT/pki) and checks an API key (a `predict`
key issued into OUT/pki/keys.jsonl). Callers send stateless Predict calls (a 50-interaction
history, 4 candidates) for --seconds per phase; the phases alternate plain / secure for --rounds
rounds at 1 and at 32 callers, so machine noise falls on both alike. Each secure caller holds its
own TLS channel (the handshake is paid once per channel, as a client with a pooled channel does).
Prints p50 / p99 / calls per second per mode and the secure/plain ratios; writes OUT/security.json.
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

MODES = ("plain", "secure")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_flags(p, "security")
    p.add_argument("--callers", default="1,32", help="comma-separated caller counts")
    p.add_argument("--seconds", type=float, default=5.0, help="length of one phase")
    p.add_argument("--rounds", type=int, default=3, help="plain/secure alternations per caller count")


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


def _phase(channels: list, request, seconds: float) -> tuple[list[float], float]:
    """Every channel's caller sends `request` back to back for `seconds`; (latencies in ms, calls/s)."""
    from serving.api import knowledge_tracing_pb2_grpc as pb_grpc

    latencies: list[list[float]] = [[] for _ in channels]
    failures: list[str] = []
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

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(len(channels))]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise UserError(f"{len(failures)} calls failed ({failures[0]}); the benchmark counts only successes")
    flat = [x for per in latencies for x in per]
    return flat, len(flat) / (time.monotonic() - started)


def run(args: argparse.Namespace) -> int:
    from serving.api import knowledge_tracing_pb2 as pb
    from serving.client import connect
    from serving.security.api_keys import issue_key

    callers = [int(c) for c in args.callers.split(",") if c.strip()]
    if not callers or min(callers) < 1 or args.seconds <= 0 or args.rounds < 1:
        raise UserError("--callers must list counts >= 1, --seconds > 0 and --rounds >= 1")
    vocabulary = load_vocabulary(args.repository, args.model)
    questions = vocabulary.questions
    args.out.mkdir(parents=True, exist_ok=True)
    ca, cert, key = make_pki(args.out / "pki")
    keys = args.out / "pki" / "keys.jsonl"
    keys.unlink(missing_ok=True)
    token = issue_key(keys, "bench", ["predict"])
    request = pb.PredictRequest(model=vocabulary.model, history=[
        pb.Interaction(question_id=questions[i % len(questions)], correct=i % 2) for i in range(50)],
        candidates=[pb.Candidate(question_id=q) for q in questions[:4]])
    results: dict[int, dict[str, dict[str, list]]] = {}
    with ExitStack() as stack:
        stop_children_on_sigterm(stack)
        repository = args.repository.resolve()
        triton = start_triton(stack, repository, args.out)
        targets = {"plain": start_gateway(stack, repository, vocabulary.model, triton.grpc_url),
                   "secure": start_gateway(stack, repository, vocabulary.model, triton.grpc_url,
                                           tls_cert=cert, tls_key=key, api_keys=keys)}
        ca_pem = ca.read_bytes()
        for n in callers:
            channels = {"plain": [connect(targets["plain"]) for _ in range(n)],
                        "secure": [connect(targets["secure"], api_key=token, tls_ca=ca_pem) for _ in range(n)]}
            for mode in MODES:
                for channel in channels[mode]:
                    stack.callback(channel.close)
                _phase(channels[mode], request, 1.0)                       # warm-up: handshakes, first calls
            results[n] = {mode: {"ms": [], "rate": []} for mode in MODES}
            print(f"{n} caller(s): {args.rounds} rounds of {args.seconds:g} s per mode, alternating", file=sys.stderr)
            for r in range(args.rounds):
                for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                    ms, rate = _phase(channels[mode], request, args.seconds)
                    results[n][mode]["ms"].extend(ms)
                    results[n][mode]["rate"].append(rate)
    report = {}
    print("| callers | mode | p50 ms | p99 ms | calls/s | p50 secure/plain | calls/s secure/plain |")
    print("|---|---|---|---|---|---|---|")
    for n, modes in results.items():
        row = {m: {"p50_ms": float(np.percentile(modes[m]["ms"], 50)), "p99_ms": float(np.percentile(modes[m]["ms"], 99)),
                   "calls_per_s": float(np.mean(modes[m]["rate"])), "calls": len(modes[m]["ms"])} for m in MODES}
        p50_ratio = row["secure"]["p50_ms"] / row["plain"]["p50_ms"]
        rate_ratio = row["secure"]["calls_per_s"] / row["plain"]["calls_per_s"]
        for m in MODES:
            ratios = f"{p50_ratio:.2f} | {rate_ratio:.2f}" if m == "secure" else " | "
            print(f"| {n} | {m} | {row[m]['p50_ms']:.2f} | {row[m]['p99_ms']:.2f} | {row[m]['calls_per_s']:.0f} | {ratios} |")
        report[str(n)] = {**row, "p50_secure_over_plain": p50_ratio, "rate_secure_over_plain": rate_ratio}
    (args.out / "security.json").write_text(json.dumps(
        {"callers": report, "seconds": args.seconds, "rounds": args.rounds, "cpus": os.cpu_count(),
         "date": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=2) + "\n")
    return 0
