"""Learner sessions across processes and faults, with real servers on loopback: two gateway
processes sharing one redis-server, kill -9 of a gateway under Observe load (SQLite and Redis),
and the redis-server killed under load (session calls UNAVAILABLE in time, stateless Predict with a
real Triton unaffected, recovery without restarting the gateway)."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from loadtest.harness import GatewayProcess
from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.sessions.keys import SECRET_ENV, LearnerKeys
from serving.sessions.redis_server import RedisServer
from serving.sessions.factory import open_store
from serving.tritonserver.launcher import TritonServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SECRET = "process-test-secret-of-32-bytes!"


class Gateway(GatewayProcess):
    """`routerkt serve` with a session store as a child process (stopped by PID), started at once,
    with a channel to it."""

    def __init__(self, repository: Path, store_url: str, folder: Path, triton_url: str | None = None) -> None:
        backend = ["--triton-url", triton_url] if triton_url else ["--backend", "onnxruntime"]
        super().__init__(repository, folder, ["--store", store_url, "--store-keep", "1000000", *backend],
                         env={SECRET_ENV: SECRET}, http=False)   # keep everything: the tests count every event
        self.start()
        self.channel = grpc.insecure_channel(self.address)
        self.stub = pb_grpc.KnowledgeTracingServiceStub(self.channel)

    def wait_ready(self, service: str, timeout: float = 90.0) -> "Gateway":
        self.wait_serving((service,), timeout)
        return self

    def kill(self) -> None:
        super().kill()
        self.channel.close()

    def stop(self) -> None:
        super().stop()
        self.channel.close()


def event(learner: int, writer: int, n: int, i: int) -> pb.Event:
    return pb.Event(event_id=f"w{writer}-n{n}-i{i}", question_id=writer * 100_000 + n * 10 + i, correct=(n + i) % 2)


def observe_load(stubs, learners: int, writers: int, seconds: float, acked: list, stop: threading.Event) -> None:
    """Each writer sends 3-event Observes round-robin over the learners and the stubs; records
    (learner, question ids) of every acknowledged call."""
    def writer(w: int) -> None:
        n = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end and not stop.is_set():
            learner = n % learners
            events = [event(learner, w, n, i) for i in range(3)]
            try:
                stubs[(w + n) % len(stubs)].Observe(
                    pb.ObserveRequest(learner_id=f"learner-{learner}", events=events), timeout=5.0)
                acked.append((learner, w, n, [e.question_id for e in events], events))
            except (grpc.RpcError, ValueError):          # ValueError: the channel of a killed gateway closed
                pass
            n += 1
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(1, writers + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def stored_questions(store_url: str, learner: int) -> list[int]:
    import asyncio

    async def read():
        store = open_store(store_url)
        await store.open()
        try:
            key = LearnerKeys(SECRET.encode()).learner(f"learner-{learner}")
            return (await store.history(key, 100_000)).questions.tolist()
        finally:
            await store.close()
    return asyncio.run(read())


@pytest.fixture
def redis(tmp_path):
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def test_two_gateways_share_one_redis_exactly_once_in_order(kt_repository, redis, tmp_path) -> None:
    gateways = [Gateway(kt_repository.path, redis.url, tmp_path / f"gw{i}") for i in range(2)]
    try:
        for gw in gateways:
            gw.wait_ready("routerkt.v1.Sessions")
        acked: list = []
        observe_load([gw.stub for gw in gateways], learners=4, writers=4, seconds=3.0, acked=acked,
                     stop=threading.Event())
    finally:
        for gw in gateways:
            gw.stop()
    assert len(acked) > 20
    for learner in range(4):
        stored = stored_questions(redis.url, learner)
        mine = [q for entry in acked if entry[0] == learner for q in entry[3]]
        assert sorted(stored) == sorted(mine)                       # every acknowledged event exactly once
        assert len(stored) == len(set(stored))
        for start in range(0, len(stored), 3):                       # each call's events stay together
            assert stored[start:start + 3] == list(range(stored[start], stored[start] + 3))
        for w in range(1, 5):                                        # each writer's calls in its order
            by_writer = [q for q in stored if q // 100_000 == w]
            assert by_writer == sorted(by_writer)


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_kill_9_of_the_gateway_loses_no_acknowledged_event(kt_repository, tmp_path, kind: str) -> None:
    server = RedisServer(tmp_path / "redis").start() if kind == "redis" else None
    url = server.url if server else f"sqlite:///{tmp_path / 'sessions.sqlite3'}"
    try:
        gw = Gateway(kt_repository.path, url, tmp_path / "gw").wait_ready("routerkt.v1.Sessions")
        acked: list = []
        stop = threading.Event()
        load = threading.Thread(target=observe_load, args=([gw.stub], 6, 4, 8.0, acked, stop))
        load.start()
        time.sleep(2.0)
        gw.kill()                                                    # mid-load, no shutdown at all
        stop.set()
        load.join()
        assert len(acked) > 10
        again = Gateway(kt_repository.path, url, tmp_path / "gw2").wait_ready("routerkt.v1.Sessions")
        try:
            for learner, _, _, _, events in acked:                   # every acknowledged event is there
                reply = again.stub.Observe(pb.ObserveRequest(learner_id=f"learner-{learner}", events=events),
                                           timeout=10.0)
                assert (reply.stored, reply.duplicates) == (0, 3)
        finally:
            again.stop()
    finally:
        if server:
            server.stop()


def test_a_killed_redis_gives_unavailable_in_time_and_the_gateway_recovers(kt_repository, tmp_path) -> None:
    triton = TritonServer(kt_repository.path, log_path=tmp_path / "triton.log", exit_timeout_s=3)
    triton.start(timeout=120)
    redis = RedisServer(tmp_path / "redis").start()
    gw = Gateway(kt_repository.path, redis.url, tmp_path / "gw", triton_url=triton.grpc_url)
    try:
        gw.wait_ready("routerkt.v1.Sessions").wait_ready("")
        stateless = pb.PredictRequest(model="kt", candidates=[pb.Candidate(question_id=1)],
                                      history=[pb.Interaction(question_id=1, correct=1)])
        expected = list(gw.stub.Predict(stateless, timeout=10.0).probabilities)
        one = [pb.Event(event_id="before", question_id=1, correct=1)]
        assert gw.stub.Observe(pb.ObserveRequest(learner_id="l", events=one), timeout=5.0).stored == 1
        redis.kill()
        for i in range(5):                                           # session calls: UNAVAILABLE within 1 s
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as info:
                gw.stub.Observe(pb.ObserveRequest(learner_id="l", events=[
                    pb.Event(event_id=f"during-{i}", question_id=1, correct=1)]), timeout=1.0)
            assert info.value.code() is grpc.StatusCode.UNAVAILABLE and time.monotonic() - started < 1.0
            with pytest.raises(grpc.RpcError) as info:
                gw.stub.Predict(pb.PredictRequest(model="kt", learner_id="l",
                                                  candidates=[pb.Candidate(question_id=1)]), timeout=1.0)
            assert info.value.code() is grpc.StatusCode.UNAVAILABLE
            assert list(gw.stub.Predict(stateless, timeout=5.0).probabilities) == expected
        health = health_pb2_grpc.HealthStub(gw.channel)
        time.sleep(1.5)
        assert health.Check(health_pb2.HealthCheckRequest(service="routerkt.v1.Sessions"), timeout=2).status == 2
        redis = RedisServer(tmp_path / "redis", port=redis.port).start()   # same port, same AOF
        deadline = time.monotonic() + 15
        while True:
            try:
                reply = gw.stub.Observe(pb.ObserveRequest(learner_id="l", events=one), timeout=2.0)
                break
            except grpc.RpcError:
                assert time.monotonic() < deadline, "the gateway did not reconnect to the restarted store"
                time.sleep(0.2)
        assert (reply.stored, reply.duplicates) == (0, 1)            # the event from before survived the kill
        gw.wait_ready("routerkt.v1.Sessions", timeout=10)
    finally:
        gw.stop()
        redis.stop()
        triton.stop()
