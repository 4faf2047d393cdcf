"""`routerkt bench load`: a locust load test of the gateway with simulated learners, judged by SLOs.

    routerkt bench load [--users 8] [--spawn-rate R] [--duration 60s] [--target HOST:PORT]
                        [--repository model_repository] [--model NAME] [--out bench/load]
                        [--max-failure-ratio 0.01] [--max-p99-ms 500]
                        [--user-classes LearnerUser:3,BatchUser:1]

Without --target, tritonserver and the gateway are started here (free 127.0.0.1 ports; Triton's
log in OUT/triton.log) and stopped afterwards (Triton by PID). With --target (loopback only), the
running gateway is used; --repository still provides the ids the learners use. locust runs
headless as a subprocess (loadtest/locustfile.py; its log in OUT/locust.log, CSVs OUT/locust_*.csv),
bounded by --duration plus a margin, after which it is stopped by PID.

`--sessions` runs three phases in one invocation, each against its own gateway in front of one
Triton: stateless LearnerUsers (history in every Predict), then SessionUsers (Predict by
learner_id, then Observe of the answer) on a SQLite store, then on a redis-server started here;
it prints their Predict / Observe latencies and events/s side by side (OUT/<phase>/ per phase,
OUT/sessions.json). --target cannot be combined with it.

Prints requests/s and p50/p95/p99 per RPC, writes OUT/load.json, and exits 1 when an SLO fails:
the failure ratio above --max-failure-ratio, any RPC's p99 above --max-p99-ms, an RPC of the chosen
user classes never called, or the load test itself broken. locust's own exit code for "some
requests failed" is NOT a failure by itself: it is moved to a dedicated value
(--exit-code-on-error 3) and the failure ratio decides. Percentiles are locust's (rounded to two
significant digits above 100 ms).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

from loadtest.harness import add_common_flags, start_servers, stop_children_on_sigterm
from loadtest.learners import (DEFAULT_WEIGHTS, USER_RPCS, Vocabulary, format_user_mix, load_vocabulary,
                               loopback_target, parse_user_mix)
from loadtest.locust_runner import (LOCUST_FAILURES_EXIT, STARTUP_MARGIN_S, RpcStats, locust_command, log_tail,
                                    read_rows, read_stats, run_locust)
from routerkt.atomic import atomic_write_json
from routerkt.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--users", type=int, default=8, help="simulated users (LearnerUser / BatchUser instances)")
    p.add_argument("--spawn-rate", type=float, default=None, help="users started per second (default: all in 1 s)")
    p.add_argument("--duration", default="60s", help="run time: 90, 45s, 2m, 1m30s, 1h")
    p.add_argument("--target", default=None,
                   help="use the running gateway at HOST:PORT (loopback only) instead of starting one")
    add_common_flags(p, "load")
    p.add_argument("--max-failure-ratio", type=float, default=0.01, help="SLO: failed / all requests")
    p.add_argument("--max-p99-ms", type=float, default=500.0, help="SLO: p99 latency of every RPC, ms")
    p.add_argument("--sessions", action="store_true",
                   help="stateless vs session users on SQLite and Redis, side by side (starts its own servers)")
    p.add_argument("--user-classes", default=format_user_mix(DEFAULT_WEIGHTS),
                   help=f"user classes and weights, CLASS[:WEIGHT],... (classes: {', '.join(USER_RPCS)})")
    p.add_argument("--max-candidates", type=int, default=4, help="candidates per question round: 1..K")
    p.add_argument("--max-history", type=int, default=200, help="interactions a learner keeps")
    p.add_argument("--batch-learners", type=int, default=8, help="learners per PredictBatch call")
    p.add_argument("--predict-timeout", type=float, default=2.0, help="deadline of each Predict, s")
    p.add_argument("--batch-timeout", type=float, default=5.0, help="deadline of each PredictBatch, s")
    p.add_argument("--think-time", type=float, default=0.05, help="wait between tasks: uniform in [0, this] s")


# -- results -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Slo:
    max_failure_ratio: float
    max_p99_ms: float


def check_slos(rpcs: dict[str, RpcStats], total: RpcStats, slo: Slo, expected_rpcs: list[str]) -> list[str]:
    """The SLO violations, one readable line each ([] = passed)."""
    if total.requests == 0:
        return ["no requests were made"]
    problems = []
    ratio = total.failures / total.requests
    if ratio > slo.max_failure_ratio:
        problems.append(f"failure ratio {ratio:.4f} > {slo.max_failure_ratio} "
                        f"({total.failures} of {total.requests} requests failed)")
    for name in expected_rpcs:
        if rpcs.get(name) is None or rpcs[name].requests == 0:
            problems.append(f"no {name} requests were made (too few --users for the --user-classes mix?)")
    for name, stats in sorted(rpcs.items()):
        if stats.p99_ms is not None and stats.p99_ms > slo.max_p99_ms:
            problems.append(f"{name} p99 {stats.p99_ms:g} ms > {slo.max_p99_ms:g} ms")
    return problems


def locust_problems(exit_code: int | None, overran: bool, exceptions: int) -> list[str]:
    """Problems of the load test itself (not of the server). Exit code 0 or LOCUST_FAILURES_EXIT
    (requests failed: the SLOs decide) are fine; anything else means locust itself broke."""
    problems = []
    if overran:
        problems.append("locust ran past --duration plus its margin and was stopped")
    elif exit_code not in (0, LOCUST_FAILURES_EXIT):
        problems.append(f"locust exited with code {exit_code} (see locust.log)")
    if exceptions:
        problems.append(f"the locustfile raised {exceptions} exception(s) (see locust_exceptions.csv)")
    return problems


def format_table(rpcs: dict[str, RpcStats], total: RpcStats) -> str:
    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:,.0f}"
    lines = [f"{'rpc':<14}{'requests':>10}{'failures':>10}{'req/s':>9}"
             + "".join(f"{title:>9}" for title in ("p50 ms", "p95 ms", "p99 ms", "max ms"))]
    for name, s in [*sorted(rpcs.items()), ("all", total)]:
        lines.append(f"{name:<14}{s.requests:>10}{s.failures:>10}{s.requests_per_s:>9.1f}{cell(s.p50_ms):>9}"
                     f"{cell(s.p95_ms):>9}{cell(s.p99_ms):>9}{cell(s.max_ms):>9}")
    return "\n".join(lines)


def write_json(path: Path, data: dict) -> None:
    atomic_write_json(path, data)


# -- flags ---------------------------------------------------------------------------------------
def parse_duration(text: str) -> int:
    """"90" / "45s" / "2m" / "1m30s" / "1h" -> seconds (> 0)."""
    text = text.strip().lower()
    if text.isdigit():
        seconds = int(text)
    else:
        match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
        if not text or match is None:
            raise UserError(f"--duration {text!r}: expected e.g. 90, 45s, 2m, 1m30s")
        hours, minutes, secs = (int(group or 0) for group in match.groups())
        seconds = 3600 * hours + 60 * minutes + secs
    if seconds <= 0:
        raise UserError("--duration must be > 0")
    return seconds


def validate(args: argparse.Namespace) -> tuple[int, dict[str, int], float]:
    """(duration s, user mix, spawn rate); UserError naming the first bad flag."""
    duration = parse_duration(args.duration)
    mix = parse_user_mix(args.user_classes)
    if args.users < len(mix):
        raise UserError(f"--users {args.users} is fewer than the {len(mix)} user classes in --user-classes")
    spawn_rate = float(args.users) if args.spawn_rate is None else args.spawn_rate
    if not spawn_rate > 0:
        raise UserError("--spawn-rate must be > 0")
    if not 0.0 <= args.max_failure_ratio <= 1.0:
        raise UserError("--max-failure-ratio must be in [0, 1]")
    if not args.max_p99_ms > 0:
        raise UserError("--max-p99-ms must be > 0")
    for flag in ("max_candidates", "batch_learners"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag.replace('_', '-')} must be >= 1")
    if args.max_history < 0:
        raise UserError("--max-history must be >= 0")
    if not args.predict_timeout > 0 or not args.batch_timeout > 0 or args.think_time < 0:
        raise UserError("--predict-timeout and --batch-timeout must be > 0, --think-time >= 0")
    if args.target is not None:
        loopback_target(args.target)
    return duration, mix, spawn_rate


# -- the gateway -----------------------------------------------------------------------------------
def check_target(target: str) -> None:
    """The gateway at `target` answers its health check with SERVING (bounded wait)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target, options=[("grpc.enable_http_proxy", 0)]) as channel:
        try:
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10.0,
                                                               wait_for_ready=True).status
        except grpc.RpcError as exc:
            raise UserError(f"no gateway answering at {target}: {exc.code().name}") from None
    if status != health_pb2.HealthCheckResponse.SERVING:
        raise UserError(f"the gateway at {target} is not SERVING (health status {status})")


def build_report(args: argparse.Namespace, target: str, vocabulary: Vocabulary, rpcs: dict[str, RpcStats],
                 total: RpcStats, slo: Slo, violations: list[str], exit_code: int | None, broken: list[str],
                 duration: int, mix: dict[str, int], spawn_rate: float, failure_rows: list[dict[str, str]]) -> dict:
    """The content of OUT/load.json."""
    failures = [{"rpc": row.get("Name", ""), "error": row.get("Error", ""),
                 "occurrences": int(row.get("Occurrences") or 0)} for row in failure_rows]
    return {
        "target": target, "started_servers": args.target is None,
        "model": vocabulary.model, "version": vocabulary.version,
        "rpcs": {name: asdict(stats) for name, stats in sorted(rpcs.items())}, "total": asdict(total),
        "failure_ratio": total.failures / total.requests if total.requests else None,
        "failures": sorted(failures, key=lambda f: -f["occurrences"])[:20],
        "slo": {**asdict(slo), "passed": not violations, "violations": violations},
        "locust_exit_code": exit_code, "load_test_problems": broken,
        "settings": {"users": args.users, "spawn_rate": spawn_rate, "duration_s": duration, "user_classes": mix,
                     "max_candidates": args.max_candidates, "max_history": args.max_history,
                     "batch_learners": args.batch_learners, "predict_timeout_s": args.predict_timeout,
                     "batch_timeout_s": args.batch_timeout, "think_time_s": args.think_time,
                     "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%dT%H:%M:%S")},
    }


# -- the command ---------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    duration, mix, spawn_rate = validate(args)
    vocabulary = load_vocabulary(args.repository, args.model)          # fails before anything starts
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.sessions:
        from loadtest.load_sessions import run_sessions
        return run_sessions(args, duration, spawn_rate, vocabulary, out)
    for stale in out.glob("locust_*.csv"):
        stale.unlink()
    timeout_s = duration + STARTUP_MARGIN_S + 0.1 * duration
    with ExitStack() as stack:
        stop_children_on_sigterm(stack)                          # SIGTERM: stop what we started, too
        if args.target is None:
            target = start_servers(stack, args.repository.resolve(), vocabulary.model, out)
        else:
            target = loopback_target(args.target)
            check_target(target)
        command = locust_command(args, target, vocabulary.model, mix, duration, spawn_rate, out)
        print(f"locust: {args.users} users ({format_user_mix(mix)}), {duration} s against {target}, "
              f"model {vocabulary.model} v{vocabulary.version}", file=sys.stderr)
        exit_code, overran = run_locust(command, out, timeout_s)
    exceptions = sum(int(row.get("Count") or 1) for row in read_rows(out / "locust_exceptions.csv"))
    broken = locust_problems(exit_code, overran, exceptions)
    if exit_code not in (0, LOCUST_FAILURES_EXIT) and not (out / "locust_stats.csv").is_file():
        print(f"locust failed (exit code {exit_code}); last lines of {out / 'locust.log'}:\n"
              f"{log_tail(out / 'locust.log')}", file=sys.stderr)
        return 1
    rpcs, total = read_stats(out / "locust_stats.csv")
    slo = Slo(args.max_failure_ratio, args.max_p99_ms)
    violations = check_slos(rpcs, total, slo, [USER_RPCS[name] for name in mix])
    report = build_report(args, target, vocabulary, rpcs, total, slo, violations, exit_code, broken,
                          duration, mix, spawn_rate, read_rows(out / "locust_failures.csv"))
    write_json(out / "load.json", report)
    print(format_table(rpcs, total))
    for failure in report["failures"][:5]:
        print(f"  failed {failure['occurrences']}x {failure['rpc']}: {failure['error']}")
    print(f"\nwrote {out / 'load.json'} (locust CSVs and log beside it)")
    for problem in broken:
        print(f"load test failed: {problem}", file=sys.stderr)
    for violation in violations:
        print(f"SLO failed: {violation}", file=sys.stderr)
    if broken or violations:
        return 1
    print(f"SLOs met: failure ratio <= {slo.max_failure_ratio}, p99 <= {slo.max_p99_ms:g} ms")
    return 0
