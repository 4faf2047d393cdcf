"""The tritonserver that `routerkt serve` starts is the gateway's alone (docs/security.md): a local
process of the same host finds no Triton HTTP port (the probe's `POST /v2/repository/models/NAME/
unload` has nowhere to go), its gRPC listens on a Unix socket in a folder only this user may open,
and over that socket every administrative call without the key (unload, load with an uploaded
model.py, the repository index, configs, statistics, logging, trace) is refused, with nothing
loaded, unloaded or run; the gateway, which sends the key, keeps serving."""
from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2 as tpb
from tritonclient.grpc import service_pb2_grpc as tpb_grpc

from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.processes import free_port
from serving.security.triton_access import GRPC_HEADER_PREFIX, RESTRICTED_GROUPS, TRITON_KEY_HEADER
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def listening_tcp_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on (its socket inodes matched in /proc/net/tcp{,6})."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:                     # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def refused(call) -> str:
    """The details of the refusal `call()` gets (fails the test when it succeeds)."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE, info.value
    return info.value.details()


def test_served_triton_refuses_local_processes_without_the_key_and_the_gateway_still_works(
        kt_repository, tmp_path) -> None:
    grpc_port, http_port = free_port(), free_port()
    state = tmp_path / "state"
    out, err = tmp_path / "serve.out", tmp_path / "serve.err"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "routerkt.cli", "serve", "--repository", str(kt_repository.path),
                                 "--grpc-port", str(grpc_port), "--http-port", str(http_port), "--store", "none",
                                 "--state-dir", str(state), "--sample-model", "kt", "--log-format", "json"],
                                cwd=ROOT, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr)
    marker = tmp_path / "uploaded-code-ran"
    try:
        wait_for(lambda: "sample response:" in out.read_text() or proc.poll() is not None, 180, "the sample", step=0.2)
        assert proc.poll() is None, err.read_text()[-3000:]
        messages = [json.loads(line)["message"] for line in err.read_text().splitlines() if line.strip()]
        line = next(m for m in messages if m.startswith("Triton: gRPC"))
        triton_pid = int(re.search(r"\(pid (\d+),", line).group(1))
        argv = Path(f"/proc/{triton_pid}/cmdline").read_bytes().decode().split("\0")

        # what a local process finds: no HTTP port; TCP only for metrics, where the probe's unload goes nowhere
        assert "--allow-http=false" in argv and not any(a.startswith("--http-port") for a in argv)
        (metrics_port,) = [int(a.split("=", 1)[1]) for a in argv if a.startswith("--metrics-port=")]
        assert listening_tcp_ports(triton_pid) == {metrics_port}
        answer = httpx.post(f"http://127.0.0.1:{metrics_port}/v2/repository/models/kt/unload", timeout=5,
                            trust_env=False)
        assert answer.status_code != 200

        # gRPC: a Unix socket in a folder only this user may enter
        (address,) = [a.split("=", 1)[1] for a in argv if a.startswith("--grpc-address=")]
        assert address.startswith("unix:/")
        folder = Path(address[len("unix:"):]).parent
        info = os.stat(folder)
        assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()
        (socket_path,) = list(folder.iterdir())

        # the key: made for this run, mode 0600, what Triton's restricted protocol names
        key_file = state / "triton.key"
        assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
        key = key_file.read_text().strip()
        assert f"--grpc-restricted-protocol={RESTRICTED_GROUPS}:{TRITON_KEY_HEADER}={key}" in argv
        assert key not in err.read_text() and key not in out.read_text()

        # a local process of this user over the socket, without the key: every administrative call refused
        with grpc.insecure_channel(f"unix:{socket_path}") as channel:
            triton = tpb_grpc.GRPCInferenceServiceStub(channel)
            upload = tpb.RepositoryModelLoadRequest(model_name="kt", parameters={
                "config": tpb.ModelRepositoryParameter(string_param=json.dumps({"backend": "python"})),
                "file:1/model.py": tpb.ModelRepositoryParameter(
                    bytes_param=f"open({str(marker)!r}, 'w').write('ran')\n".encode())})
            calls = {
                "unload": lambda md: triton.RepositoryModelUnload(
                    tpb.RepositoryModelUnloadRequest(model_name="kt"), timeout=10, metadata=md),
                "load with files": lambda md: triton.RepositoryModelLoad(upload, timeout=30, metadata=md),
                "repository index": lambda md: triton.RepositoryIndex(tpb.RepositoryIndexRequest(), timeout=10,
                                                                      metadata=md),
                "config": lambda md: triton.ModelConfig(tpb.ModelConfigRequest(name="kt"), timeout=10, metadata=md),
                "statistics": lambda md: triton.ModelStatistics(tpb.ModelStatisticsRequest(name="kt"), timeout=10,
                                                                metadata=md),
                "logging": lambda md: triton.LogSettings(tpb.LogSettingsRequest(settings={
                    "log_verbose_level": tpb.LogSettingsRequest.SettingValue(uint32_param=1)}), timeout=10, metadata=md),
                "trace": lambda md: triton.TraceSetting(tpb.TraceSettingRequest(), timeout=10, metadata=md),
            }
            for name, call in calls.items():
                for metadata in (None, ((GRPC_HEADER_PREFIX + TRITON_KEY_HEADER, "wrong-" + key),),
                                 ((TRITON_KEY_HEADER, key),)):       # the HTTP spelling of the header is not it
                    assert "restricted" in refused(lambda: call(metadata)), name
            assert not marker.exists()
            # the key itself opens the same call (so the refusals above are the key's doing)
            index = triton.RepositoryIndex(tpb.RepositoryIndexRequest(ready=True), timeout=10,
                                           metadata=((GRPC_HEADER_PREFIX + TRITON_KEY_HEADER, key),))
            assert "kt" in {m.name for m in index.models}

        # the gateway (which sends the key on its index/load calls) still serves the model
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = pb_grpc.KnowledgeTracingServiceStub(channel)
            key = (state / "admin.key").read_text().strip()          # serve's default admin key (0600)
            reply = stub.Predict(pb.PredictRequest(model="kt", candidates=[pb.Candidate(question_id=1)]), timeout=10,
                                 metadata=(("authorization", f"Bearer {key}"),))
        assert len(reply.probabilities) == 1
        ready = httpx.get(f"http://127.0.0.1:{http_port}/readyz", timeout=5, trust_env=False)
        assert ready.status_code == 200, ready.text

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, err.read_text()[-3000:]
        assert not folder.exists()                       # the private socket folder goes with Triton
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
