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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    """Every small call: (phase, start, end, status code name, version that answered or 0)."""

    def __init__(self) -> None:
        self.phase = PHASES[0]
        self.calls: list[tuple[str, float, float, str, int]] = []
        self.lock = threading.Lock()

    def add(self, started: float, ended: float, code: str, version: int) -> None:
        with self.lock:
            self.calls.append((self.phase, started, ended, code, version))

    def snapshot(self) -> list[tuple[str, float, float, str, int]]:
        with self.lock:
            return list(self.calls)

    def wait_first(self, since: float, limit_s: float, answered: Callable[[str, int], bool]) -> float | None:
        """Seconds from `since` to the end of the first call started after it that `answered(code,
        version)` accepts, polled every 0.1 s for at most `limit_s`; None when none came."""
        first = None
        while time.monotonic() - since < limit_s and first is None:
            time.sleep(0.1)
            ends = [ended for _, started, ended, code, version in self.snapshot()
                    if answered(code, version) and started > since]
            first = min(ends) - since if ends else None
        return first


@dataclass
class Chaos:
    """What the phases share: `routerkt serve` (over a copy of the repository), its stub, the calls."""
    gateway: GatewayProcess
    repository: Path
    model: str
    stub: Any
    small: Any
    recorder: Recorder = field(default_factory=Recorder)
    stop: threading.Event = field(default_factory=threading.Event)
    callers: list[threading.Thread] = field(default_factory=list)
    tritons: list[int] = field(default_factory=list)          # every tritonserver serve was seen running

    @property
    def serve(self) -> subprocess.Popen:
        return self.gateway.process

    def tritonservers(self) -> list[int]:
        from serving.tritonserver.procfs import children, cmdline
        return [pid for pid in children(self.serve.pid) if "tritonserver" in cmdline(pid)]


def run(args: argparse.Namespace) -> int:
    from serving.api import knowledge_tracing_pb2_grpc as service
    from serving.client import connect

    if args.callers < 1 or args.phase_seconds <= 0:
        raise UserError("--callers must be >= 1 and --phase-seconds > 0")
    vocabulary = load_vocabulary(args.repository, args.model)
    args.out.mkdir(parents=True, exist_ok=True)
    repository = args.out / "repository"
    shutil.rmtree(repository, ignore_errors=True)
    shutil.copytree(args.repository, repository)
    (args.out / "serve.log").unlink(missing_ok=True)
    # its own tritonserver, serve's default grace period
    gateway = GatewayProcess(repository, args.out, ["--store", "none"], grace_period_s=None,
                             log_name="serve.log").start()
    small, big = _requests(vocabulary)
    channel = connect(gateway.address)
    chaos = Chaos(gateway, repository, vocabulary.model, service.KnowledgeTracingServiceStub(channel), small)
    try:
        first_version = _baseline(chaos, args.callers, args.phase_seconds)
        big_codes = _max_batch(chaos, big, args.phase_seconds)
        recovery = _triton_kill(chaos)
        new_version, first_use = _publish(chaos)
        lost, exit_code, phases = _sigterm(chaos)
        report = {"first_version": first_version, "new_version": int(new_version), "recovery_s": recovery,
                  "publish_first_use_s": first_use, "lost_in_flight_at_sigterm": lost, "serve_exit_code": exit_code,
                  "max_batch_calls": dict(big_codes), "phases": phases}
    finally:
        _stop(chaos, channel)
    _print_report(report)
    report.update(callers=args.callers, phase_seconds=args.phase_seconds, cpus=os.cpu_count(),
                  date=time.strftime("%Y-%m-%dT%H:%M:%S"))
    (args.out / "chaos.json").write_text(json.dumps(report, indent=2) + "\n")
    shutil.rmtree(repository, ignore_errors=True)
    return 0


def _requests(vocabulary) -> tuple[Any, Any]:
    """(the small Predict of the callers, the maximal PredictBatch: 64 learners x 64 candidates x 1,000)."""
    from serving.api import knowledge_tracing_pb2 as pb

    questions = vocabulary.questions
    history = [pb.Interaction(question_id=questions[i % len(questions)], correct=i % 2) for i in range(1000)]
    small = pb.PredictRequest(model=vocabulary.model, history=history[:30],
                              candidates=[pb.Candidate(question_id=questions[0])])
    big = pb.PredictBatchRequest(model=vocabulary.model, learners=[pb.LearnerRequest(history=history, candidates=[
        pb.Candidate(question_id=questions[(3 * j) % len(questions)]) for j in range(64)]) for _ in range(64)])
    return small, big


def _baseline(chaos: Chaos, callers: int, seconds: float) -> int:
    """Waits for serve to answer (at most 180 s), starts the callers, lets them run alone for `seconds`;
    the version that answered first."""
    import grpc

    deadline = time.monotonic() + 180
    while True:
        if chaos.serve.poll() is not None or time.monotonic() > deadline:
            raise UserError(f"routerkt serve did not become ready (see {chaos.gateway.log})")
        try:
            chaos.stub.Predict(chaos.small, timeout=2.0)
            break
        except grpc.RpcError:
            time.sleep(0.5)
    first_version = chaos.stub.Predict(chaos.small, timeout=5.0).version

    def caller() -> None:
        while not chaos.stop.is_set():
            started = time.monotonic()
            try:
                version = chaos.stub.Predict(chaos.small, timeout=2.0).version
                chaos.recorder.add(started, time.monotonic(), "OK", version)
            except grpc.RpcError as exc:
                chaos.recorder.add(started, time.monotonic(), exc.code().name, 0)
                time.sleep(0.05)
    chaos.callers = [threading.Thread(target=caller, daemon=True) for _ in range(callers)]
    for thread in chaos.callers:
        thread.start()
    time.sleep(seconds)
    return first_version


def _max_batch(chaos: Chaos, big, seconds: float) -> Counter:
    """Maximal PredictBatch calls back to back for `seconds` beside the callers; their status codes."""
    import grpc

    chaos.recorder.phase = "max batch"
    big_codes: Counter = Counter()
    phase_end = time.monotonic() + seconds
    while time.monotonic() < phase_end:
        try:
            chaos.stub.PredictBatch(big, timeout=30.0)
            big_codes["OK"] += 1
        except grpc.RpcError as exc:
            big_codes[exc.code().name] += 1
    return big_codes


def _triton_kill(chaos: Chaos) -> float | None:
    """SIGKILL of serve's tritonserver; seconds to the first OK call started after it (None: none in 120 s)."""
    chaos.recorder.phase = "triton kill"
    tritons = chaos.tritonservers()
    killed_at = time.monotonic()
    for pid in tritons:
        os.kill(pid, signal.SIGKILL)
    return chaos.recorder.wait_first(killed_at, 120, lambda code, version: code == "OK")


def _publish(chaos: Chaos) -> tuple[int, float | None]:
    """A copy of the latest version published as a new one; (its number, seconds to its first answer:
    None when it answered no call within 60 s)."""
    from export.repository import publish_version
    from routerkt.contract.repository_reader import latest_version, version_dir
    from routerkt.contract.signature import CONFIG_FILE

    chaos.recorder.phase = "publish"
    repository, model = chaos.repository, chaos.model
    source = version_dir(repository, model, latest_version(repository, model))
    files = {path.name: path for path in source.iterdir() if path.is_file()}
    published_at = time.monotonic()
    new_version = publish_version(repository, model, files, (repository / model / CONFIG_FILE).read_text())
    first_use = chaos.recorder.wait_first(published_at, 60, lambda code, version: version == new_version)
    time.sleep(1.0)
    return new_version, first_use


def _sigterm(chaos: Chaos) -> tuple[int, int | None, dict[str, dict]]:
    """SIGTERM of serve, then the callers stopped; (the calls in flight not answered OK, serve's exit code,
    per phase the calls by status code and the p99 of the OK ones)."""
    chaos.recorder.phase = "sigterm"
    chaos.tritons += chaos.tritonservers()
    sigterm_at = time.monotonic()
    chaos.serve.send_signal(signal.SIGTERM)
    try:
        exit_code = chaos.serve.wait(timeout=60)
    except subprocess.TimeoutExpired:
        exit_code = None
    chaos.stop.set()
    for thread in chaos.callers:
        thread.join(timeout=10)
    calls = chaos.recorder.snapshot()
    lost = sum(1 for _, started, ended, code, _ in calls if started < sigterm_at <= ended and code != "OK")
    phases = {}
    for phase in PHASES:
        mine = [call for call in calls if call[0] == phase and (phase != "sigterm" or call[1] < sigterm_at)]
        ok_ms = [(ended - started) * 1000 for _, started, ended, code, _ in mine if code == "OK"]
        phases[phase] = {"codes": dict(Counter(call[3] for call in mine)),
                         "p99_ok_ms": float(np.percentile(ok_ms, 99)) if ok_ms else None}
    return lost, exit_code, phases


def _stop(chaos: Chaos, channel) -> None:
    """Stops the callers, serve and any tritonserver serve left behind (run's finally)."""
    from serving.processes import terminate
    from serving.tritonserver.procfs import cmdline

    chaos.stop.set()
    channel.close()
    terminate(chaos.serve, timeout_s=30)
    for pid in chaos.tritons:                            # the restarted one, should serve have left it
        if "tritonserver" in cmdline(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _print_report(report: dict) -> None:
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
