"""The gateway's life around a REAL tritonserver: Triton killed under load and restarted on the same
ports (the gateway recovers by itself), SIGTERM while calls are in flight (drain, refuse, exit 0),
and `routerkt serve` starting its own Triton with a sample prediction, then stopping both."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from serving.metrics import Metrics
from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.server import ThreadedGateway
from serving.settings import Settings
from serving.processes import free_port
from serving.tritonserver.launcher import TritonPorts, TritonServer

from tests.helpers import grpc_status as code_of
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass
class Cluster:
    """The module's Triton (replaced when a test restarts it) and its log folder."""

    triton: TritonServer
    repository: Path
    logs: Path


@pytest.fixture(scope="module")
def cluster(kt_repository, tmp_path_factory):
    logs = tmp_path_factory.mktemp("lifecycle")
    ports = TritonPorts(free_port(), free_port(), free_port())
    holder = Cluster(TritonServer(kt_repository.path, ports=ports, log_path=logs / "triton-1.log", exit_timeout_s=3),
                     kt_repository.path, logs)
    holder.triton.start(timeout=120)
    try:
        yield holder
    finally:
        holder.triton.stop()


@pytest.fixture(scope="module")
def vocab(kt_repository):
    from routerkt.contract.vocab import Vocab
    return Vocab.load(kt_repository.path / "kt" / "1" / "vocab.json")


def health(channel: grpc.Channel) -> int | None:
    try:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=2.0).status
    except grpc.RpcError:
        return None


def small_request(vocab) -> pb.PredictRequest:
    q = sorted(vocab.questions)
    return pb.PredictRequest(model="kt", history=[pb.Interaction(question_id=q[0], correct=1)],
                             candidates=[pb.Candidate(question_id=q[1]), pb.Candidate(question_id=q[2])])


def heavy_batch(vocab) -> pb.PredictBatchRequest:
    q = sorted(vocab.questions)
    learner = pb.LearnerRequest(history=[pb.Interaction(question_id=q[i], correct=i % 2) for i in range(30)],
                                candidates=[pb.Candidate(question_id=q[i]) for i in range(64)])
    return pb.PredictBatchRequest(model="kt", learners=[learner] * 64)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def kill_under_load(triton: TritonServer) -> None:
    """TritonServer.kill(), plus SIGKILL (by PID) for its python stubs: a stub busy with a request
    when tritonserver dies is orphaned and never exits by itself (seen with Triton 2.51), and
    kill() would wait 3 s for it before killing it itself."""
    server_pid, stubs = triton.pid, triton.stub_pids()
    killer = threading.Thread(target=triton.kill)
    killer.start()
    wait_for(lambda: not alive(server_pid), 15, "tritonserver to die")
    for pid in stubs:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    killer.join(timeout=20)
    assert not killer.is_alive() and not any(alive(pid) for pid in stubs)


def test_triton_killed_under_load_then_restarted(cluster: Cluster, vocab) -> None:
    settings = Settings(repository=cluster.repository, triton_url=cluster.triton.grpc_url, grpc_port=0, http_port=0,
                        probe_interval_s=0.5, probe_timeout_s=1.0, grace_period_s=2.0)
    gateway = ThreadedGateway(settings, Metrics()).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{gateway.grpc_port}")
    stub = pb_grpc.KnowledgeTracingServiceStub(channel)
    request = small_request(vocab)
    try:
        wait_for(lambda: health(channel) == SERVING, 30, "SERVING")
        codes: list[grpc.StatusCode] = []
        stop = threading.Event()

        def client() -> None:
            while not stop.is_set():
                codes.append(code_of(lambda: stub.Predict(request, timeout=3.0)))

        threads = [threading.Thread(target=client) for _ in range(3)]
        for thread in threads:
            thread.start()
        wait_for(lambda: codes.count(grpc.StatusCode.OK) >= 10, 30, "traffic before the kill")
        kill_under_load(cluster.triton)                          # SIGKILL while calls are in flight
        wait_for(lambda: health(channel) == NOT_SERVING, 15, "NOT_SERVING after the kill")
        failed_from = len(codes)
        wait_for(lambda: len(codes) >= failed_from + 10, 15, "calls while Triton is down")
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
        assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, set(codes)
        assert set(codes[failed_from:]) == {grpc.StatusCode.UNAVAILABLE}
        http = f"http://127.0.0.1:{gateway.http_port}"
        assert httpx.get(f"{http}/readyz", timeout=5, trust_env=False).status_code == 503
        assert httpx.get(f"{http}/livez", timeout=5, trust_env=False).status_code == 200

        cluster.triton = TritonServer(cluster.repository, ports=cluster.triton.ports,
                                      log_path=cluster.logs / "triton-2.log", exit_timeout_s=3)
        cluster.triton.start(timeout=120)                       # same ports, the gateway is NOT restarted
        wait_for(lambda: health(channel) == SERVING, 30, "SERVING after the restart")
        assert len(stub.Predict(request, timeout=5.0).probabilities) == 2
        assert httpx.get(f"{http}/readyz", timeout=5, trust_env=False).status_code == 200
    finally:
        channel.close()
        gateway.stop(grace=2.0)


def spawn_routerkt(args: list[str], logs: Path, name: str) -> tuple[subprocess.Popen, Path, Path]:
    out, err = logs / f"{name}.out", logs / f"{name}.err"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "routerkt.cli", *args], cwd=ROOT, stdin=subprocess.DEVNULL,
                                stdout=stdout, stderr=stderr)
    return proc, out, err


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)


def inflight(http_port: int) -> float:
    try:
        text = httpx.get(f"http://127.0.0.1:{http_port}/metrics", timeout=2.0, trust_env=False).text
    except httpx.HTTPError:
        return 0.0
    match = re.search(r"^routerkt_inflight_requests (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_sigterm_drains_in_flight_calls_and_exits_zero(cluster: Cluster, vocab) -> None:
    grpc_port, http_port = free_port(), free_port()
    proc, _, err = spawn_routerkt(["serve", "--repository", str(cluster.repository), "--triton-url",
                                   cluster.triton.grpc_url, "--grpc-port", str(grpc_port), "--http-port",
                                   str(http_port), "--grace-period", "20", "--insecure",
                                   "--state-dir", str(cluster.logs / "sigterm-state")], cluster.logs, "sigterm")
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    try:
        wait_for(lambda: health(channel) == SERVING, 60, "the gateway subprocess to serve")
        stub = pb_grpc.KnowledgeTracingServiceStub(channel)
        batch = heavy_batch(vocab)
        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(code_of, lambda: stub.PredictBatch(batch, timeout=60.0)) for _ in range(6)]
            accepted = wait_for(lambda: inflight(http_port) >= 2 and inflight(http_port), 30, "calls in flight",
                                step=0.02)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as fresh:     # a new call after SIGTERM
                refused = code_of(lambda: pb_grpc.KnowledgeTracingServiceStub(fresh).Predict(
                    small_request(vocab), timeout=5.0))
            codes = [f.result(timeout=90) for f in futures]
        assert proc.wait(timeout=60) == 0, err.read_text()[-3000:]
        assert refused is grpc.StatusCode.UNAVAILABLE
        assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, codes
        assert codes.count(grpc.StatusCode.OK) >= accepted          # every accepted call was answered
        log = err.read_text()
        assert "signal received" in log and "gateway stopped" in log
    finally:
        channel.close()
        stop_process(proc)


def test_routerkt_serve_starts_triton_prints_a_sample_and_stops_both(kt_repository, tmp_path) -> None:
    grpc_port, http_port = free_port(), free_port()
    proc, out, err = spawn_routerkt(["serve", "--repository", str(kt_repository.path), "--grpc-port", str(grpc_port),
                                     "--http-port", str(http_port), "--sample-model", "kt",
                                     "--state-dir", str(tmp_path / "state")], tmp_path, "serve")
    try:
        wait_for(lambda: "sample response:" in out.read_text() or proc.poll() is not None, 150,
                 "the sample prediction", step=0.2)
        assert proc.poll() is None, err.read_text()[-3000:]
        stdout = out.read_text()
        assert "sample request:" in stdout and re.search(r"P\(correct\) question \d+: 0\.\d{4}", stdout)
        assert "[]" not in stdout.split("sample request:")[1].splitlines()[0]    # no unset repeated fields
        entries = [json.loads(line) for line in err.read_text().splitlines() if line.strip()]   # JSON: not a TTY
        messages = [e["message"] for e in entries]
        for prefix in ("Triton: gRPC", "gateway gRPC:", "gateway HTTP:", "gateway metrics:"):
            assert sum(m.startswith(prefix) for m in messages) == 1, (prefix, messages)
        triton_pid = int(re.search(r"\(pid (\d+),", next(m for m in messages if m.startswith("Triton: gRPC"))).group(1))
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            assert health(channel) == SERVING                         # keeps serving after the sample
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, err.read_text()[-3000:]
        assert not Path(f"/proc/{triton_pid}").exists() or "Z" in Path(f"/proc/{triton_pid}/stat").read_text().split()[2]
        messages = [json.loads(line)["message"] for line in err.read_text().splitlines() if line.strip()]
        assert any(m.startswith("Triton stopped") for m in messages)
        assert messages.index("gateway stopped") < next(i for i, m in enumerate(messages) if m.startswith("Triton stopped"))
    finally:
        stop_process(proc)


def test_a_sigkilled_serve_leaves_no_triton_and_no_stubs(kt_repository, tmp_path) -> None:
    """SIGKILL of `routerkt serve` (nothing of it runs any more): its Triton guard
    (serving/tritonserver/watchdog.py) stops the tritonserver it started, the python stubs and their
    shared-memory files, instead of leaving them running."""
    from serving.tritonserver.procfs import children, cmdline
    from serving.tritonserver.launcher import STUB_NAME, shm_files
    grpc_port, http_port = free_port(), free_port()
    proc, out, err = spawn_routerkt(["serve", "--repository", str(kt_repository.path), "--grpc-port", str(grpc_port),
                                     "--http-port", str(http_port), "--state-dir", str(tmp_path / "state")],
                                tmp_path, "serve")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            wait_for(lambda: proc.poll() is not None or health(channel) == SERVING, 150, "SERVING", step=0.2)
        assert proc.poll() is None, err.read_text()[-3000:]
        messages = [json.loads(line)["message"] for line in err.read_text().splitlines() if line.strip()]
        triton_pid = int(re.search(r"\(pid (\d+),", next(m for m in messages if m.startswith("Triton: gRPC"))).group(1))
        stubs = [pid for pid in children(triton_pid) if STUB_NAME in cmdline(pid)]
        shm = [f"/proc/{triton_pid}/root{p}" for p in shm_files([triton_pid, *stubs])]   # its private /dev/shm
        assert stubs and shm and all(Path(p).exists() for p in shm)
        (address,) = [a for a in cmdline(triton_pid).split() if a.startswith("--grpc-address=unix:")]
        socket_folder = Path(address.split("unix:", 1)[1]).parent              # serve's private socket folder
        proc.kill()                                                   # no handler, no atexit: only the guard is left
        proc.wait(timeout=10)
        wait_for(lambda: not alive(triton_pid) and not any(alive(pid) for pid in stubs), 30,
                 "tritonserver and its stubs to be stopped by the guard")
        wait_for(lambda: not any(Path(p).exists() for p in shm), 10, "the stubs' shared memory to be removed")
        wait_for(lambda: not socket_folder.exists(), 10, "Triton's socket folder to be removed")
    finally:
        stop_process(proc)
