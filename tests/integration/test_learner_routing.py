"""Two real gateways on one Redis store, reached through the Python client's LearnerRouter (consistent hashing on the
learner id, serving/client.py) and by a client that alternates between them call by call: routed, every returning
learner's Predict is a hit on the gateway that holds its state; alternating, a Predict lands where the other
gateway stored the last answer, which is appended there instead. Both answer as the history sent (<= 1e-5)."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import grpc
import pytest

from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.client import LearnerRouter, connect
from serving.processes import free_port, terminate
from serving.sessions.redis_server import RedisServer
from serving.sessions.redis_store import RedisStore
from tests.integration.security_helpers import Pem, make_ca, make_cert
from tests.integration.test_learner_states import RESULTS, Learner, Served, setup  # noqa: F401  (module fixture)

pytestmark = pytest.mark.integration
pytest.importorskip("torch")


class Routed:
    """A stub-like front of a LearnerRouter (Learner calls `served.stub.Predict` / `.Observe`)."""

    def __init__(self, router: LearnerRouter) -> None:
        self.stub, self.router = self, router

    def Predict(self, request, timeout=None):
        return self.router.call("Predict", request, timeout)

    def Observe(self, request, timeout=None):
        return self.router.call("Observe", request, timeout)


class Alternating:
    """Each call naming a learner on the next gateway in turn (a round-robin balancer at its worst for a learner's
    state: its Observe and its next Predict on different gateways); the stateless Predicts on the first."""

    def __init__(self, channels) -> None:
        self.stub, self.stubs, self.calls = self, [pb_grpc.KnowledgeTracingServiceStub(c) for c in channels], 0

    def _next(self, request):
        if not request.learner_id:
            return self.stubs[0]
        self.calls += 1
        return self.stubs[self.calls % len(self.stubs)]

    def Predict(self, request, timeout=None):
        return self._next(request).Predict(request, timeout=timeout)

    def Observe(self, request, timeout=None):
        return self._next(request).Observe(request, timeout=timeout)


def visits(front, name: str, questions, skills) -> tuple[list[Learner], float]:
    """12 learners: 5 answers stored, then 4 visits of a Predict and one more answer; them, and the largest gap."""
    learners = [Learner(front, f"{name}-{k}", questions, skills, seed=40 + k) for k in range(12)]
    gap = 0.0
    for learner in learners:
        learner.observe(5)
    for _ in range(4):
        for learner in learners:
            gap = max(gap, learner.gap())
            learner.observe(1)
    return learners, gap


def test_routed_learners_hit_the_gateway_that_holds_their_state(setup, tmp_path_factory) -> None:
    repository, _, questions, skills = setup
    with RedisServer(tmp_path_factory.mktemp("redis-routing")) as redis:
        host, port = redis.url.split("//", 1)[1].split("/", 1)[0].split(":")
        a, b = (Served(repository, None, store=RedisStore(host, int(port), db=3)) for _ in range(2))
        try:
            addresses = [f"127.0.0.1:{a.gateway.grpc_port}", f"127.0.0.1:{b.gateway.grpc_port}"]

            def lookups() -> dict[str, int]:
                return {r: a.lookups()[r] + b.lookups()[r] for r in a.lookups()}
            with LearnerRouter(addresses) as router:
                owners = {router.owner(f"routed-{k}") for k in range(12)}
                assert owners == set(addresses)                       # both gateways own learners
                _, routed_gap = visits(Routed(router), "routed", questions, skills)
            routed = lookups()
            channels = [connect(address) for address in addresses]
            try:
                _, alternating_gap = visits(Alternating(channels), "alternating", questions, skills)
            finally:
                for channel in channels:
                    channel.close()
            alternating = {r: n - routed[r] for r, n in lookups().items()}
            assert max(routed_gap, alternating_gap) <= 1e-5
            assert routed == {"miss": 12, "hit": 36, "appended": 0, "stale": 0}, routed   # Observe's fill, same gateway
            assert alternating["hit"] < 36 and alternating["appended"] > 0, alternating
        finally:
            a.close()
            b.close()


HAPROXY_CFG = Path(__file__).resolve().parents[2] / "serving" / "deploy" / "k8s" / "haproxy.cfg"


def haproxy_command() -> str:
    """The haproxy binary (Debian puts it in /usr/sbin); a failure, not a skip, when it is missing."""
    haproxy = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")
    if haproxy is None:
        pytest.fail("needs haproxy (Debian's package; `make install` installs it)")
    return haproxy


class Proxied:
    """The shipped router config (serving/deploy/k8s/haproxy.cfg) run by a real HAProxy on loopback, TLS on both
    sides, in front of `gateways` (host:port each); `stub` reaches it through serving.client.connect, which sends
    the route header of every call naming a learner."""

    def __init__(self, folder: Path, gateways: list[str], ca: Pem, cert: Pem) -> None:
        haproxy = haproxy_command()
        crt = folder / "router.crt"                       # the config's naming: tls.crt beside tls.key
        shutil.copy(cert.cert, crt)
        shutil.copy(cert.key, folder / "router.key")
        self.port = free_port()
        env = {"PATH": os.environ.get("PATH", ""), "ROUTERKT_ROUTER_BIND": f"127.0.0.1:{self.port}",
               "ROUTERKT_ROUTER_TLS_CERT": str(crt), "ROUTERKT_TLS_CA": str(ca.cert),
               "ROUTERKT_GATEWAY_TLS_NAME": "localhost",
               **{f"ROUTERKT_GATEWAY_{k}": address for k, address in enumerate(gateways, 1)}}
        self.log = folder / "haproxy.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen([haproxy, "-db", "-f", str(HAPROXY_CFG)], env=env, stdout=log,
                                            stderr=subprocess.STDOUT)
        self.channel = connect(f"127.0.0.1:{self.port}", tls_ca=ca.cert.read_bytes())
        self.stub = pb_grpc.KnowledgeTracingServiceStub(self.channel)
        deadline = time.monotonic() + 20
        while True:                                       # up and every gateway's check passed (rise 2, 2 s)
            try:
                grpc.channel_ready_future(self.channel).result(timeout=1)
                break
            except grpc.FutureTimeoutError:
                assert self.process.poll() is None, self.log.read_text()
                assert time.monotonic() < deadline, self.log.read_text()

    def close(self) -> None:
        self.channel.close()
        terminate(self.process, 10)


def test_the_shipped_haproxy_router_sends_each_learner_to_one_gateway(setup, tmp_path_factory) -> None:
    """Through HAProxy with the shipped config: every returning learner's Predict is a hit (as with the client's own
    LearnerRouter), both gateways hold learners, and with one gateway stopped every call is still answered, exactly
    (the router sends its learners to the other one, which rebuilds them from the store)."""
    repository, _, questions, skills = setup
    folder = tmp_path_factory.mktemp("haproxy-router")
    ca = make_ca(folder, "ca")
    cert = make_cert(folder, ca, "gateway")
    tls = {"tls_cert": cert.cert, "tls_key": cert.key}
    with RedisServer(tmp_path_factory.mktemp("redis-haproxy")) as redis:
        host, port = redis.url.split("//", 1)[1].split("/", 1)[0].split(":")
        a, b = (Served(repository, None, store=RedisStore(host, int(port), db=4), **tls) for _ in range(2))
        open_gateways, proxy = [a, b], None
        try:
            proxy = Proxied(folder, [f"localhost:{a.gateway.grpc_port}", f"localhost:{b.gateway.grpc_port}"], ca,
                            cert)
            learners, gap = visits(proxy, "proxied", questions, skills)
            per_gateway = [a.lookups(), b.lookups()]
            assert gap <= 1e-5
            assert {r: per_gateway[0][r] + per_gateway[1][r] for r in RESULTS} == \
                {"miss": 12, "hit": 36, "appended": 0, "stale": 0}, per_gateway
            assert all(lookups["miss"] > 0 for lookups in per_gateway), per_gateway   # both gateways hold learners
            open_gateways.remove(b)
            b.close()
            for learner in learners:                      # b's learners: redispatched to a, rebuilt there
                gap = max(gap, learner.gap())
            assert gap <= 1e-5
            assert a.lookups()["miss"] == 12, a.lookups()
        finally:
            if proxy is not None:
                proxy.close()
            for served in open_gateways:
                served.close()


def test_the_shipped_router_config_checks_with_dns_discovery(tmp_path) -> None:
    """The branch Kubernetes and compose use (one DNS name resolving to every gateway) is a valid HAProxy config."""
    haproxy = haproxy_command()
    ca = make_ca(tmp_path, "ca")
    cert = make_cert(tmp_path, ca, "router")
    shutil.copy(cert.cert, tmp_path / "tls.crt")
    shutil.copy(cert.key, tmp_path / "tls.key")
    env = {"PATH": os.environ.get("PATH", ""), "ROUTERKT_ROUTER_BIND": f"127.0.0.1:{free_port()}",
           "ROUTERKT_ROUTER_TLS_CERT": str(tmp_path / "tls.crt"), "ROUTERKT_TLS_CA": str(ca.cert),
           "ROUTERKT_GATEWAY_TLS_NAME": "routerkt-gateway", "ROUTERKT_GATEWAY_DNS": "localhost:50051",
           "ROUTERKT_GATEWAY_SLOTS": "10"}
    checked = subprocess.run([haproxy, "-c", "-f", str(HAPROXY_CFG)], env=env, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    del env["ROUTERKT_TLS_CA"]
    assert subprocess.run([haproxy, "-c", "-f", str(HAPROXY_CFG)], env=env, capture_output=True).returncode != 0
