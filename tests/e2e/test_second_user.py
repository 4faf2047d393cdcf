"""Another local user beside a default `routerkt serve` (what `make serve` runs): it reads no learner
data (shared memory, files, sockets, gateway calls) and can neither change the rollout nor forget
learners (docs/security.md's threat model). The probe (tests/e2e/second_user_probe.py) runs as uid
65534 with no capabilities; the gateway runs as the test's user, from a folder others may enter, as a
checkout is."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc
import pytest

from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.processes import free_port
from serving.tritonserver.launcher import shm_files
from serving.tritonserver.procfs import children, cmdline
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("second_user_probe.py")
OTHER_UID = 65534
LEARNER = "routerkt-sample-learner"          # what the sample Observes


@pytest.fixture(scope="module")
def served(kt_repository):
    if os.geteuid() != 0:
        pytest.fail("the second-user probe needs root to drop to another uid (CI runs as root)")
    checkout = Path(tempfile.mkdtemp(prefix="routerkt-checkout-"))
    os.chmod(checkout, 0o755)                                     # as a clone is: others may enter
    grpc_port, http_port = free_port(), free_port()
    out, err = checkout / "serve.out", checkout / "serve.err"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "routerkt.cli", "serve", "--repository", str(kt_repository.path),
                                 "--grpc-port", str(grpc_port), "--http-port", str(http_port), "--sample-model", "kt",
                                 "--log-format", "json"], cwd=checkout, stdin=subprocess.DEVNULL,
                                stdout=stdout, stderr=stderr, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        wait_for(lambda: "sample session:" in out.read_text() or proc.poll() is not None, 180, "the sample session")
        assert proc.poll() is None, err.read_text()[-3000:]
        triton = next(pid for pid in children(proc.pid) if "tritonserver" in cmdline(pid))
        yield checkout, grpc_port, http_port, proc.pid, triton
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(checkout, ignore_errors=True)


@pytest.fixture(scope="module")
def seen(served) -> dict:
    checkout, grpc_port, http_port, serve_pid, triton = served
    done = subprocess.run([sys.executable, str(PROBE), str(OTHER_UID), str(checkout / ".routerkt"), str(grpc_port),
                           str(http_port), str(serve_pid), str(triton), LEARNER, "kt"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_the_probe_is_unprivileged(seen) -> None:
    assert seen["uid"] == OTHER_UID and seen["shadow"] == "PermissionError"


def test_no_shared_memory_of_triton_is_reachable(seen, served) -> None:
    *_, triton = served
    ours = {Path(p).name for p in shm_files([triton, *children(triton)])}     # as the server sees them
    assert ours                                                       # its stubs map their regions
    assert not ours & set(seen["host_shm_regions"]), seen["host_shm_regions"]   # none in the host's /dev/shm
    assert seen["triton_root_shm"] == "PermissionError"              # and its own is closed


def test_no_state_file_or_socket_is_reachable(seen) -> None:
    assert seen["state_dir_list"] == "PermissionError"
    assert all(not answer.startswith("ok") for answer in seen["state_files"].values()), seen["state_files"]
    assert not seen["sqlite"].startswith("ok"), seen["sqlite"]
    assert seen["triton_socket"] == "PermissionError"
    assert seen["gateway_environ"] == "PermissionError"
    assert not re.search(r"serve-admin\.\S{20,}", seen["gateway_cmdline"])    # no key on the command line


def test_the_gateway_answers_it_nothing_and_takes_no_order(seen, served) -> None:
    assert seen["grpc_predict_by_id"] == "UNAUTHENTICATED"
    assert seen["grpc_forget"] == "UNAUTHENTICATED"
    assert seen["http_predict_by_id"] == "401"
    assert seen["http_rollout_change"] == "401"
    assert seen["http_rollout_read"] == "HTTPError"
    checkout, grpc_port, *_ = served
    key = (checkout / ".routerkt" / "admin.key").read_text().strip()    # the serving user's own key
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        reply = pb_grpc.KnowledgeTracingServiceStub(channel).Predict(
            pb.PredictRequest(model="kt", learner_id=LEARNER, candidates=[pb.Candidate(question_id=1)]),
            timeout=10, metadata=(("authorization", f"Bearer {key}"),))
    assert reply.history_used == 5                                    # the learner is still there
    assert oct((checkout / ".routerkt").stat().st_mode & 0o777) == "0o700"
    assert oct((checkout / ".routerkt" / "admin.key").stat().st_mode & 0o777) == "0o600"
