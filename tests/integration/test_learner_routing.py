"""Two real gateways on one Redis store, reached through the Python client's LearnerRouter (consistent hashing on the
learner id, serving/client.py) and by a client that alternates between them call by call: routed, every returning
learner's Predict is a hit on the gateway that holds its state; alternating, a Predict lands where the other
gateway stored the last answer, which is appended there instead. Both answer as the history sent (<= 1e-5)."""
from __future__ import annotations

import pytest

from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.client import LearnerRouter, connect
from serving.sessions.redis_server import RedisServer
from serving.sessions.redis_store import RedisStore
from tests.integration.test_learner_states import Learner, Served, setup  # noqa: F401  (the module's fixture)

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


def visits(front, name: str, questions, skills) -> float:
    """12 learners: 5 answers stored, then 4 visits of a Predict and one more answer; the largest gap."""
    learners = [Learner(front, f"{name}-{k}", questions, skills, seed=40 + k) for k in range(12)]
    gap = 0.0
    for learner in learners:
        learner.observe(5)
    for _ in range(4):
        for learner in learners:
            gap = max(gap, learner.gap())
            learner.observe(1)
    return gap


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
                routed_gap = visits(Routed(router), "routed", questions, skills)
            routed = lookups()
            channels = [connect(address) for address in addresses]
            try:
                alternating_gap = visits(Alternating(channels), "alternating", questions, skills)
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
