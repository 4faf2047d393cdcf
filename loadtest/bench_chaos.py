"""`routerkt bench chaos`: one bounded run of faults under load, and what the callers saw.

A `routerkt serve` process (it starts and supervises its own tritonserver) over a COPY of the
repository (so the publish below never touches yours), and `--callers` threads of small stateless
Predict calls through the shipped client (serving/client.py: retries on UNAVAILABLE). Phases:

    baseline    load only
    max batch   plus maximal PredictBatch calls (64 learners x 64 candidates x 1,000 interactions)
    triton kill SIGKILL of the tritonserver; the phase ends at the first OK call after it
    publish     a new version is published; the phase ends once a call is answered by it
    sigterm     SIGTERM of `routerkt serve`: in-flight calls must be answered, then it exits

Prints calls by status code per phase, the p99 of small calls per phase, the time from the kill
to the first OK, the time from publishing to the first answer of the new version, the calls lost
(started before the SIGTERM, not answered OK) and serve's exit code; writes OUT/chaos.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter

import numpy as np

from loadtest.harness import GatewayProcess, add_common_flags
from loadtest.learners import load_vocabulary
from routerkt.errors import UserError

PHASES = ("baseline", "max batch", "triton kill", "publish", "sigterm")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_flags(p, "chaos")
    p.add_argument("--callers", type=int, default=4)
    p.add_argument("--phase-seconds", type=float, default=6.0, help="length of the fixed phases")


class Recorder:
    """Every small call: (phase, start, end, status code name)."""

    def __init__(self) -> None:
        self.phase = PHASES[0]
        self.calls: list[tuple[str, float, float, str, int]] = []
        self.lock = threading.Lock()

    def add(self, started: float, ended: float, code: str, version: int) -> None:
        with self.lock:
            self.calls.append((self.phase, started, ended, code, version))


def run(args: argparse.Namespace) -> int:
    import grpc

    from export.repository import publish_version
    from routerkt.contract.repository import latest_version, version_dir
    from routerkt.contract.signature import CONFIG_FILE
    from serving.api import knowledge_tracing_pb2 as pb
    from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
    from serving.client import connect
    from serving.processes import terminate
    from serving.tritonserver.procfs import children, cmdline

    if args.callers < 1 or args.phase_seconds <= 0:
        raise UserError("--callers must be >= 1 and --phase-seconds > 0")
    vocabulary = load_vocabulary(args.repository, args.model)
    model = vocabulary.model
    args.out.mkdir(parents=True, exist_ok=True)
    repo = args.out / "repository"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(args.repository, repo)
    (args.out / "serve.log").unlink(missing_ok=True)
    # its own tritonserver, serve's default grace period
    gateway = GatewayProcess(repo, args.out, ["--store", "none"], grace_period_s=None, log_name="serve.log").start()
    serve = gateway.process
    q = vocabulary.questions
    history = [pb.Interaction(question_id=q[i % len(q)], correct=i % 2) for i in range(1000)]
    small = pb.PredictRequest(model=model, history=history[:30], candidates=[pb.Candidate(question_id=q[0])])
    big = pb.PredictBatchRequest(model=model, learners=[pb.LearnerRequest(history=history, candidates=[
        pb.Candidate(question_id=q[(3 * j) % len(q)]) for j in range(64)]) for _ in range(64)])
    recorder, stop, big_codes = Recorder(), threading.Event(), Counter()
    channel = connect(gateway.address)
    stub = pb_grpc.KnowledgeTracingServiceStub(channel)
    report: dict[str, object] = {}
    started_tritons: list[int] = []
    try:
        deadline = time.monotonic() + 180
        while True:
            if serve.poll() is not None or time.monotonic() > deadline:
                raise UserError(f"routerkt serve did not become ready (see {gateway.log})")
            try:
                stub.Predict(small, timeout=2.0)
                break
            except grpc.RpcError:
                time.sleep(0.5)
        first_version = stub.Predict(small, timeout=5.0).version

        def caller() -> None:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    version = stub.Predict(small, timeout=2.0).version
                    recorder.add(started, time.monotonic(), "OK", version)
                except grpc.RpcError as exc:
                    recorder.add(started, time.monotonic(), exc.code().name, 0)
                    time.sleep(0.05)
        threads = [threading.Thread(target=caller, daemon=True) for _ in range(args.callers)]
        for t in threads:
            t.start()
        time.sleep(args.phase_seconds)

        recorder.phase = "max batch"
        phase_end = time.monotonic() + args.phase_seconds
        while time.monotonic() < phase_end:
            try:
                stub.PredictBatch(big, timeout=30.0)
                big_codes["OK"] += 1
            except grpc.RpcError as exc:
                big_codes[exc.code().name] += 1

        recorder.phase = "triton kill"
        tritons = [p for p in children(serve.pid) if "tritonserver" in cmdline(p)]
        killed_at = time.monotonic()
        for pid in tritons:
            os.kill(pid, signal.SIGKILL)
        recovery = None
        while time.monotonic() - killed_at < 120 and recovery is None:
            time.sleep(0.1)
            with recorder.lock:
                ok = [e for _, s, e, code, _ in recorder.calls if code == "OK" and s > killed_at]
            recovery = min(ok) - killed_at if ok else None

        recorder.phase = "publish"
        source = version_dir(repo, model, latest_version(repo, model))
        files = {p.name: p for p in source.iterdir() if p.is_file()}
        published_at = time.monotonic()
        new_version = publish_version(repo, model, files, (repo / model / CONFIG_FILE).read_text())
        first_use = None
        while time.monotonic() - published_at < 60 and first_use is None:
            time.sleep(0.1)
            with recorder.lock:
                used = [e for _, s, e, code, v in recorder.calls if v == new_version and s > published_at]
            first_use = min(used) - published_at if used else None
        time.sleep(1.0)

        recorder.phase = "sigterm"
        started_tritons += [p for p in children(serve.pid) if "tritonserver" in cmdline(p)]
        sigterm_at = time.monotonic()
        serve.send_signal(signal.SIGTERM)
        try:
            exit_code = serve.wait(timeout=60)
        except subprocess.TimeoutExpired:
            exit_code = None
        stop.set()
        for t in threads:
            t.join(timeout=10)
        with recorder.lock:
            calls = list(recorder.calls)
        lost = sum(1 for _, s, e, code, _ in calls if s < sigterm_at <= e and code != "OK")
        report = {"first_version": first_version, "new_version": int(new_version), "recovery_s": recovery,
                  "publish_first_use_s": first_use, "lost_in_flight_at_sigterm": lost, "serve_exit_code": exit_code,
                  "max_batch_calls": dict(big_codes), "phases": {}}
        for phase in PHASES:
            mine = [c for c in calls if c[0] == phase and (phase != "sigterm" or c[1] < sigterm_at)]
            ok_ms = [(e - s) * 1000 for _, s, e, code, _ in mine if code == "OK"]
            report["phases"][phase] = {"codes": dict(Counter(c[3] for c in mine)),
                                       "p99_ok_ms": float(np.percentile(ok_ms, 99)) if ok_ms else None}
    finally:
        stop.set()
        channel.close()
        terminate(serve, timeout_s=30)
        for pid in started_tritons:                      # the restarted one, should serve have left it
            if "tritonserver" in cmdline(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
    print("| phase | calls by status (small Predict) | p99 of OK small calls, ms |")
    print("|---|---|---|")
    for phase, row in report["phases"].items():
        codes = ", ".join(f"{k} {v}" for k, v in sorted(row["codes"].items()))
        p99 = "-" if row["p99_ok_ms"] is None else f"{row['p99_ok_ms']:.0f}"
        print(f"| {phase} | {codes} | {p99} |")
    print(f"maximal PredictBatch calls: {report['max_batch_calls']}")
    print(f"Triton killed: first OK after {report['recovery_s']:.2f} s" if report["recovery_s"] is not None
          else "Triton killed: no OK within 120 s")
    print(f"version {report['new_version']} published: first answer after {report['publish_first_use_s']:.2f} s"
          if report["publish_first_use_s"] is not None else "published version never answered within 60 s")
    print(f"SIGTERM: {report['lost_in_flight_at_sigterm']} calls in flight not answered OK; "
          f"routerkt serve exited with {report['serve_exit_code']}")
    report.update(callers=args.callers, phase_seconds=args.phase_seconds, cpus=os.cpu_count(),
                  date=time.strftime("%Y-%m-%dT%H:%M:%S"))
    (args.out / "chaos.json").write_text(json.dumps(report, indent=2) + "\n")
    shutil.rmtree(repo, ignore_errors=True)
    return 0
