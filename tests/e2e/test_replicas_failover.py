"""Scale-out on loopback: 2 tritonservers, 1 redis-server, 2 `routerkt serve` processes (each over
both Tritons: --triton-url A,B, one shared store), and a client balancing over both gateways with
the documented retry policy (serving/client.py connect_balanced). Under load (Observe + Predict by
learner id, and stateless Predict): SIGKILL of one Triton, then of one gateway, gives 0 failed
calls; the restarted Triton (same ports) gets inferences again, the restarted gateway (same ports)
gets calls again."""
from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest

from loadtest.harness import GatewayProcess
from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.client import connect_balanced
from serving.sessions.keys import SECRET_ENV
from serving.sessions.redis_server import RedisServer
from serving.tritonserver.launcher import TritonServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SECRET = "replica-test-secret-of-32-bytes!"
CALL_TIMEOUT_S = 5.0
CALLERS = 3
SERVICES = ("", "routerkt.v1.Sessions")           # the gateway's health services, both must be SERVING


def gateway(repository: Path, triton_urls: str, store_url: str, folder: Path) -> GatewayProcess:
    """`routerkt serve --triton-url A,B --store redis://...` (same ports on every restart)."""
    return GatewayProcess(repository, folder, ["--triton-url", triton_urls, "--store", store_url],
                          env={SECRET_ENV: SECRET})


def readyz(gw: GatewayProcess) -> dict:
    return json.loads(gw.get("/readyz")[1])


class Load:
    """CALLERS threads over one balanced channel: Observe one event, Predict by learner id,
    stateless Predict, in a loop. Every failed call is recorded with the phase it happened in."""

    def __init__(self, addresses: list[str]) -> None:
        self.channel = connect_balanced(addresses)
        self.stub = pb_grpc.KnowledgeTracingServiceStub(self.channel)
        self.phase = "warm"
        self.ok: Counter = Counter()
        self.failures: list[tuple[str, str, str, str]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._caller, args=(i,), daemon=True) for i in range(CALLERS)]

    def start(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def _call(self, method: str, request) -> None:
        phase = self.phase
        try:
            getattr(self.stub, method)(request, timeout=CALL_TIMEOUT_S)
            with self._lock:
                self.ok[phase] += 1
        except grpc.RpcError as exc:
            with self._lock:
                self.failures.append((phase, method, exc.code().name, exc.details() or ""))

    def _caller(self, caller: int) -> None:
        learner = f"replica-learner-{caller}"
        n = 0
        while not self._stop.is_set():
            question = 1 + (caller * 7 + n) % 40
            self._call("Observe", pb.ObserveRequest(learner_id=learner, events=[
                pb.Event(event_id=f"c{caller}-n{n}", question_id=question, correct=n % 2)]))
            self._call("Predict", pb.PredictRequest(model="kt", learner_id=learner,
                                                    candidates=[pb.Candidate(question_id=question + 1)]))
            self._call("Predict", pb.PredictRequest(
                model="kt", history=[pb.Interaction(question_id=1 + (n + i) % 40, correct=i % 2) for i in range(8)],
                candidates=[pb.Candidate(question_id=question), pb.Candidate(question_id=question + 2)]))
            n += 1
            time.sleep(0.01)

    def ok_in(self, phase: str) -> int:
        with self._lock:
            return self.ok[phase]

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=CALL_TIMEOUT_S * 6)
        self.channel.close()


def wait_for(what: str, condition, timeout: float, details=lambda: "") -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if condition():
            return time.monotonic() - started
        time.sleep(0.2)
    raise AssertionError(f"{what} not within {timeout:.0f}s\n{details()}")


def test_killed_triton_and_gateway_cost_no_call_and_rejoin(kt_repository, tmp_path) -> None:
    repository = kt_repository.path
    tritons = [TritonServer(repository, log_path=tmp_path / f"triton-{i}.log", exit_timeout_s=3) for i in range(2)]
    redis = RedisServer(tmp_path / "redis")
    gateways: list[GatewayProcess] = []
    load: Load | None = None
    try:
        starting = [threading.Thread(target=t.start, kwargs={"timeout": 120}) for t in tritons]
        for thread in starting:
            thread.start()
        redis.start()
        for thread in starting:
            thread.join()
        assert all(t.is_running() for t in tritons), [t.log_tail(20) for t in tritons]
        urls = ",".join(t.grpc_url for t in tritons)
        gateways = [gateway(repository, urls, redis.url, tmp_path / f"gw{i}") for i in range(2)]
        for gw in gateways:
            gw.start()
        for gw in gateways:
            gw.wait_serving(SERVICES, timeout=60.0)
            wait_for(f"both replicas ready in {gw.address}", lambda gw=gw: all(
                r["serving"] for r in readyz(gw)["replicas"]), 30, gw.tail)

        load = Load([gw.address for gw in gateways]).start()
        wait_for("calls under load", lambda: load.ok_in("warm") >= 30, 30)
        assert all(gw.metric("routerkt_triton_replica_inferences_total", replica=str(i)) > 0
                   for gw in gateways for i in range(2)), "both gateways spread over both replicas"

        # -- SIGKILL one Triton: the gateways fail over to the other, no call fails -----------------
        load.phase = "triton killed"
        tritons[0].kill()
        wait_for("replica 0 marked down", lambda: all(
            not readyz(gw)["replicas"][0]["triton"] for gw in gateways), 15)
        down = [gw.metric("routerkt_triton_replica_inferences_total", replica="0") for gw in gateways]
        mark = load.ok_in("triton killed")
        wait_for("calls with one Triton", lambda: load.ok_in("triton killed") >= mark + 30, 30)
        assert [gw.metric("routerkt_triton_replica_inferences_total", replica="0") for gw in gateways] == down
        assert all(readyz(gw)["ready"] for gw in gateways)

        # -- restart it on the same ports: it rejoins ----------------------------------------------
        load.phase = "triton restarted"
        tritons[0] = TritonServer(repository, ports=tritons[0].ports, log_path=tmp_path / "triton-0b.log",
                                  exit_timeout_s=3)
        tritons[0].start(timeout=120)
        back = [gw.metric("routerkt_triton_replica_inferences_total", replica="0") for gw in gateways]
        rejoined = wait_for("inferences on the restarted Triton from both gateways", lambda: all(
            gw.metric("routerkt_triton_replica_inferences_total", replica="0") > b + 5
            for gw, b in zip(gateways, back)), 20)
        wait_for("routerkt_triton_replica_up 1 again (the gauge follows the replicas every 0.25 s)", lambda: all(
            gw.metric("routerkt_triton_replica_up", replica="0") == 1 for gw in gateways), 10)

        # -- SIGKILL one gateway: the client's round robin + retries, no call fails ----------------
        load.phase = "gateway killed"
        gateways[0].kill()
        mark = load.ok_in("gateway killed")
        wait_for("calls with one gateway", lambda: load.ok_in("gateway killed") >= mark + 30, 30)

        # -- restart it on the same ports: it serves again -----------------------------------------
        load.phase = "gateway restarted"
        gateways[0].start().wait_serving(SERVICES, timeout=60.0)
        served = wait_for("calls on the restarted gateway", lambda: gateways[0].metric(
            "grpc_server_handled_total", grpc_method="Predict", grpc_code="OK") >= 10, 20, gateways[0].tail)
        mark = load.ok_in("gateway restarted")
        wait_for("calls with both gateways again", lambda: load.ok_in("gateway restarted") >= mark + 30, 30)
        load.stop()
        assert load.failures == [], load.failures[:10]
        assert all(load.ok[phase] > 0 for phase in ("warm", "triton killed", "triton restarted", "gateway killed",
                                                    "gateway restarted")), load.ok
        retries = sum(gw.metric("routerkt_triton_replica_retries_total") for gw in gateways[1:])
        print(f"calls OK per phase: {dict(load.ok)}; Triton rejoined after {rejoined:.1f}s, restarted gateway "
              f"served after {served:.1f}s; inferences retried on the other replica by the surviving gateway: "
              f"{retries:.0f}; its failed Predict calls: {gateways[1].metric('routerkt_errors_total'):.0f}")
    finally:
        if load is not None:
            load.stop()
        for gw in gateways:
            gw.stop()
        for triton in tritons:
            triton.stop()
        redis.stop()
