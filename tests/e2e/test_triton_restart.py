"""A killed Triton comes back by itself: SIGKILL of the tritonserver that `routerkt serve` started
gives UNAVAILABLE within the deadline, then an automatic restart (counted), the first OK within a
bounded time, and no process of the dead server left."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import pytest

from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.tritonserver.procfs import children, cmdline
from serving.processes import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROUTERKT = Path(sys.executable).with_name("routerkt")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_killed_triton_is_restarted_and_leaves_nothing_behind(kt_repository, tmp_path) -> None:
    grpc_port, http_port = free_port(), free_port()
    log = open(tmp_path / "serve.log", "wb")
    serve = subprocess.Popen([str(ROUTERKT), "serve", "--repository", str(kt_repository.path), "--grpc-port",
                              str(grpc_port), "--http-port", str(http_port), "--store", "none", "--log-format", "json",
                              "--insecure", "--state-dir", str(tmp_path / "state")],
                             stdout=log, stderr=log)
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    stub = pb_grpc.KnowledgeTracingServiceStub(channel)
    request = pb.PredictRequest(model="kt", candidates=[pb.Candidate(question_id=1)])

    def ok_within(seconds: float) -> float:
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                stub.Predict(request, timeout=2.0)
                return time.monotonic() - started
            except grpc.RpcError:
                time.sleep(0.25)
        raise AssertionError(f"no OK within {seconds}s: {(tmp_path / 'serve.log').read_text()[-3000:]}")

    try:
        ok_within(150)
        triton = next(p for p in children(serve.pid) if "tritonserver" in cmdline(p))
        stubs = [p for p in children(triton) if "triton_python_backend_stub" in cmdline(p)]
        assert stubs
        os.kill(triton, signal.SIGKILL)
        time.sleep(0.3)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(request, timeout=2.0)
        assert info.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        assert time.monotonic() - started < 2.5
        recovered = ok_within(120)
        assert not alive(triton) and not any(alive(p) for p in stubs)    # nothing of the dead server left
        metrics = httpx.get(f"http://127.0.0.1:{http_port}/metrics", timeout=10.0, trust_env=False).text
        assert "routerkt_triton_restarts_total 1.0" in metrics
        assert recovered < 120
    finally:
        channel.close()
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=60)
        except subprocess.TimeoutExpired:
            serve.kill()
        log.close()
