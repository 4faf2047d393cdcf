"""The session store behind an ACL user, a password from a file and TLS, against a real
redis-server: the store works with exactly the commands redis_store.ACL_COMMANDS allows; a wrong
password is UNAVAILABLE with a clear log line and no secret anywhere; SQLite files are 0600."""
from __future__ import annotations

import asyncio
import logging
import stat

import grpc
import pytest
import redis

from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.server import ThreadedGateway
from serving.sessions.factory import open_store
from serving.sessions.keys import LearnerKeys
from serving.sessions.redis_server import RedisServer, find_binary
from serving.sessions.redis_store import acl_rules
from serving.sessions.sqlite_store import SqliteStore
from serving.settings import Settings
from tests.integration.security_helpers import FakeBackend, make_ca, make_cert, stderr_until

pytestmark = pytest.mark.integration

PASSWORD = "s3cret-password-of-the-store-user"
EVENTS = [pb.Event(event_id=f"e{i}", question_id=100 + i % 3, skill_id=7, correct=i % 2) for i in range(4)]


@pytest.fixture(scope="module")
def valkey(tmp_path_factory):
    try:
        find_binary()
    except Exception:
        pytest.skip("needs redis-server or valkey-server")
    folder = tmp_path_factory.mktemp("redis")
    ca = make_ca(folder, "ca")
    cert = make_cert(folder, ca, "redis")
    server = RedisServer(folder / "data", users={"routerkt": (PASSWORD, acl_rules())},
                         tls=(cert.cert, cert.key, ca.cert)).start()
    try:
        yield server, ca, folder
    finally:
        server.stop()


def gateway(repository, store) -> ThreadedGateway:
    settings = Settings(repository=repository, grpc_port=0, http_port=None, grace_period_s=0.5)
    return ThreadedGateway(settings, backend=FakeBackend(), store=store, keys=LearnerKeys(b"k" * 32)).start()


def store_for(valkey, password: str):
    server, ca, folder = valkey
    (folder / "password").write_text(password + "\n")
    return open_store(f"rediss://routerkt@127.0.0.1:{server.port}/0", password_file=folder / "password",
                      ca_file=ca.cert)


def test_the_store_works_as_an_acl_user_over_tls(valkey, handmade_repository) -> None:
    gw = gateway(handmade_repository, store_for(valkey, PASSWORD))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}") as channel:
            stub = pb_grpc.KnowledgeTracingServiceStub(channel)
            assert stub.Observe(pb.ObserveRequest(learner_id="l1", events=EVENTS), timeout=5).stored == 4
            answer = stub.Predict(pb.PredictRequest(model="kt", learner_id="l1", candidates=[pb.Candidate(question_id=101)]),
                                  timeout=5)
            assert answer.history_used == 4
            assert stub.ForgetLearner(pb.ForgetLearnerRequest(learner_id="l1"), timeout=5).deleted == 4
    finally:
        gw.stop(0.5)
    server, ca, _ = valkey
    client = redis.Redis(port=server.port, username="routerkt", password=PASSWORD, ssl=True, ssl_ca_certs=str(ca.cert),
                         ssl_check_hostname=False)
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.flushall()                                  # outside the store's commands
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.set("elsewhere", "1")                       # outside its keys (and commands)
    client.close()


def test_a_wrong_password_is_unavailable_with_no_secret_logged(valkey, handmade_repository, caplog) -> None:
    caplog.set_level(logging.INFO)
    wrong = "not-the-password-" + PASSWORD[::-1]
    gw = gateway(handmade_repository, store_for(valkey, wrong))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}") as channel:
            with pytest.raises(grpc.RpcError) as info:
                pb_grpc.KnowledgeTracingServiceStub(channel).Observe(
                    pb.ObserveRequest(learner_id="l1", events=EVENTS), timeout=5)
    finally:
        gw.stop(0.5)
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "authentication failed for user 'routerkt'" in logged
    assert wrong not in logged and PASSWORD not in logged and wrong not in info.value.details()


def test_sqlite_files_are_created_owner_only(tmp_path) -> None:
    store = SqliteStore(tmp_path / "sessions.sqlite3")

    async def use() -> None:
        await store.open()
        await store.ping()
        await store.close()
    asyncio.run(use())
    files = sorted(tmp_path.glob("sessions*"))
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files), files


def serve_over(valkey, repository, tmp_path, password: str, *extra: str) -> list[str]:
    import sys
    from serving.processes import free_port
    server, ca, _ = valkey
    (tmp_path / "password").write_text(password + "\n")
    return [sys.executable, "-m", "routerkt.cli", "serve", "--repository", str(repository), "--grpc-port", "0",
            "--http-port", "0", "--triton-url", f"127.0.0.1:{free_port()}", "--state-dir", str(tmp_path / "state"),
            "--store", f"rediss://routerkt@127.0.0.1:{server.port}/0", "--store-password-file",
            str(tmp_path / "password"), "--store-ca-file", str(ca.cert), "--log-format", "json", *extra]


def test_serve_exits_with_one_line_when_the_store_refuses_its_password(valkey, handmade_repository, tmp_path) -> None:
    import subprocess
    wrong = "not-the-password-" + PASSWORD[::-1]
    done = subprocess.run(serve_over(valkey, handmade_repository, tmp_path, wrong), capture_output=True, text=True,
                          timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1 and "authentication failed for user 'routerkt'" in lines[0] and "--store-wait" in lines[0]
    assert wrong not in done.stderr and PASSWORD not in done.stderr


def test_serve_with_store_wait_starts_and_waits_for_the_store(valkey, handmade_repository, tmp_path) -> None:
    import subprocess
    from serving.processes import terminate
    wrong = "not-the-password-" + PASSWORD[::-1]
    process = subprocess.Popen(serve_over(valkey, handmade_repository, tmp_path, wrong, "--store-wait"),
                               stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        seen = stderr_until(process, "gateway started")
        assert any("gateway started" in line for line in seen), "".join(seen)
        assert any("authentication failed for user 'routerkt'" in line for line in seen), "".join(seen)
        assert process.poll() is None
    finally:
        terminate(process, timeout_s=15)
