"""`routerkt bench load --sessions`: stateless Predict vs learner sessions, side by side in one run.

Three phases, each a locust run (loadtest/locustfile.py) against its own in-process gateway in
front of ONE Triton: stateless LearnerUsers (the whole history in every Predict); SessionUsers
(Predict by learner_id, answer, Observe the answer) on a SQLite store; the same on a redis-server
started here (AOF, appendfsync always). Prints calls/s, p50 and p99 per RPC and phase, and the
observed events/s; writes OUT/<phase>/ (locust CSVs and log) and OUT/sessions.json.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

from loadtest.harness import start_gateway, start_triton
from loadtest.learners import Vocabulary
from loadtest.locust_runner import STARTUP_MARGIN_S, locust_command, log_tail, read_stats, run_locust
from routerkt.atomic import atomic_write_json
from routerkt.errors import UserError


SESSION_PHASES = (("stateless", {"LearnerUser": 1}), ("sqlite", {"SessionUser": 1}), ("redis", {"SessionUser": 1}))


def run_sessions(args: argparse.Namespace, duration: int, spawn_rate: float, vocabulary: Vocabulary, out: Path) -> int:
    """The three phases of --sessions (module docstring); prints one table."""
    from serving.sessions.redis_server import RedisServer

    if args.target is not None:
        raise UserError("--sessions starts its own servers: drop --target")
    rows, report = [], {}
    with ExitStack() as stack:
        repository = args.repository.resolve()
        triton = start_triton(stack, repository, out)
        redis = RedisServer(out / "redis-data").start()
        stack.callback(redis.stop)
        for phase, mix in SESSION_PHASES:
            folder = out / phase
            folder.mkdir(parents=True, exist_ok=True)
            for stale in folder.glob("locust_*.csv"):
                stale.unlink()
            store = {"stateless": None, "sqlite": f"sqlite:///{folder / 'sessions.sqlite3'}", "redis": redis.url}[phase]
            with ExitStack() as gateway_stack:
                target = start_gateway(gateway_stack, repository, vocabulary.model, triton.grpc_url, store)
                print(f"phase {phase}: {args.users} users, {duration} s against {target}", file=sys.stderr)
                exit_code, overran = run_locust(locust_command(args, target, vocabulary.model, mix, duration,
                                                               spawn_rate, folder), folder,
                                                duration + STARTUP_MARGIN_S + 0.1 * duration)
            if not (folder / "locust_stats.csv").is_file():
                print(f"phase {phase}: locust failed (exit code {exit_code}):\n{log_tail(folder / 'locust.log')}",
                      file=sys.stderr)
                return 1
            rpcs, total = read_stats(folder / "locust_stats.csv")
            report[phase] = {"rpcs": {n: asdict(r) for n, r in rpcs.items()}, "total": asdict(total),
                             "overran": overran}
            for name, stats in sorted(rpcs.items()):
                rows.append((phase, name, stats))
    print("| phase | RPC | calls/s | p50 ms | p99 ms | failures |")
    print("|---|---|---|---|---|---|")
    for phase, name, stats in rows:
        print(f"| {phase} | {name}{' (by learner_id)' if phase != 'stateless' and name == 'Predict' else ''} | "
              f"{stats.requests_per_s:.1f} | {stats.p50_ms:g} | {stats.p99_ms:g} | {stats.failures} |")
    for phase in ("sqlite", "redis"):
        observe = report[phase]["rpcs"].get("Observe")
        if observe:
            print(f"{phase}: {observe['requests_per_s']:.1f} events/s observed (one event per Observe)")
    atomic_write_json(out / "sessions.json", {"phases": report, "users": args.users, "duration_s": duration,
                                              "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%dT%H:%M:%S")})
    return 0
