"""serving/backends/triton/replica_set.py: one InferenceBackend over several Triton replicas, against
fake per-replica backends (round-robin, skipping a replica that is not ready, one retry on another
replica within the timeout, the union of ready versions) and real per-replica TritonInferenceBackends
over a fake tritonclient (the aggregate readiness gauges)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from routerkt.contract.vocab import Vocab
from serving.backends.triton.backend import TritonInferenceBackend
from serving.backends.triton.replica_set import TritonReplicaBackend, triton_backend
from serving.core.catalog import ModelVersion
from serving.metrics import Metrics
from serving.pipeline.parts import BackendError, FailureKind
from serving.settings import Settings
from tests.fake_backend import IdleBackend
from tests.helpers import triton_answer, triton_rpc_error

pytestmark = pytest.mark.unit

KT1 = ModelVersion(name="kt", version=1, window=4, max_batch_size=8, vocab=Vocab(questions={}, skills={},
                                                                                  question_skill={}))
KT2 = ModelVersion(name="kt", version=2, window=4, max_batch_size=8, vocab=KT1.vocab)
ROWS = np.zeros((2, 4), dtype=np.int64)
FEEDS = {"questions": ROWS, "skills": ROWS, "responses": ROWS}


class FakeReplica(IdleBackend):
    """A per-replica InferenceBackend: `ready` says what it serves; `errors` are raised by the next
    inferences (an UNAVAILABLE one also marks it down, as the Triton supervisor does)."""

    def __init__(self, value: float, ready: dict[str, set[int]] | None = None, delay: float = 0.0) -> None:
        self.value = value
        self.ready = {"kt": {1}} if ready is None else ready
        self.delay = delay
        self.errors: list[BackendError] = []
        self.timeouts: list[float] = []

    @property
    def calls(self) -> int:
        return len(self.timeouts)

    @property
    def serving(self) -> bool:
        return any(self.ready.values())

    def ready_versions(self, model: str) -> frozenset[int]:
        return frozenset(self.ready.get(model, ()))

    def ready_models(self) -> dict[str, list[int]]:
        return {m: sorted(v) for m, v in self.ready.items() if v}

    def unavailable_reason(self, model: str) -> str | None:
        return None if self.serving else "the inference server is not available; retry shortly"

    def describe(self) -> dict[str, object]:
        return {"triton": self.serving}

    async def infer(self, model: ModelVersion, feeds, timeout_s: float) -> np.ndarray:
        self.timeouts.append(timeout_s)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.errors:
            exc = self.errors.pop(0)
            if exc.kind is FailureKind.UNAVAILABLE:
                self.ready = {}
            raise exc
        return np.full((feeds["questions"].shape[0], model.window), self.value, dtype=np.float32)

    async def infer_outputs(self, model: ModelVersion, feeds, outputs: tuple[str, ...],
                            timeout_s: float) -> dict[str, np.ndarray]:
        probs = await self.infer(model, feeds, timeout_s)
        return {name: probs for name in outputs}


class SteppingReplica(FakeReplica):
    """A replica that runs step graphs: its answer is its value, per row."""

    def holds_states(self, model) -> bool:
        return False

    def steps(self, model: ModelVersion) -> bool:
        return True

    async def infer_step(self, model: ModelVersion, graph: str, feeds, timeout_s: float) -> dict[str, np.ndarray]:
        probs = await self.infer(model, feeds, timeout_s)
        return {"candidate_probs": probs[:, :1], "graph": np.array([graph])}


def replicas(*fakes: FakeReplica) -> tuple[TritonReplicaBackend, Metrics]:
    metrics = Metrics()
    return TritonReplicaBackend(Settings().validate(), metrics, backends=list(fakes)), metrics


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_inferences_are_spread_round_robin_over_the_ready_replicas() -> None:
    a, b, c = FakeReplica(0.1), FakeReplica(0.2), FakeReplica(0.3)
    backend, metrics = replicas(a, b, c)

    async def scenario():
        return [float((await backend.infer(KT1, FEEDS, 1.0))[0, 0]) for _ in range(9)]
    values = asyncio.run(scenario())
    assert (a.calls, b.calls, c.calls) == (3, 3, 3)
    assert sorted(set(values)) == pytest.approx([0.1, 0.2, 0.3])
    assert [sample(metrics, "routerkt_triton_replica_inferences_total", replica=str(i)) for i in range(3)] == [3, 3, 3]


def test_a_replica_that_is_not_ready_gets_no_traffic_and_is_used_again_when_back() -> None:
    a, b = FakeReplica(0.1), FakeReplica(0.2, ready={})
    backend, metrics = replicas(a, b)

    async def calls(n: int) -> None:
        for _ in range(n):
            await backend.infer(KT1, FEEDS, 1.0)
    asyncio.run(calls(6))
    assert (a.calls, b.calls) == (6, 0)
    backend.refresh_gauges()
    assert sample(metrics, "routerkt_triton_replica_up", replica="0") == 1
    assert sample(metrics, "routerkt_triton_replica_up", replica="1") == 0
    b.ready = {"kt": {1}}                                    # its probe found it ready again
    asyncio.run(calls(6))
    assert (a.calls, b.calls) == (9, 3)


def test_only_replicas_serving_the_chosen_version_are_used() -> None:
    old, new = FakeReplica(0.1, ready={"kt": {1}}), FakeReplica(0.2, ready={"kt": {1, 2}})
    backend, _ = replicas(old, new)

    async def scenario():
        for _ in range(4):
            await backend.infer(KT2, FEEDS, 1.0)
    asyncio.run(scenario())
    assert (old.calls, new.calls) == (0, 4)


@pytest.mark.parametrize("kind", [FailureKind.UNAVAILABLE, FailureKind.STUB_CRASHED, FailureKind.NOT_LOADED])
def test_a_replica_failure_is_retried_once_on_another_replica(kind: FailureKind) -> None:
    a, b = FakeReplica(0.1), FakeReplica(0.2)
    a.errors = [BackendError(kind, "boom")]
    backend, metrics = replicas(a, b)
    out = asyncio.run(backend.infer(KT1, FEEDS, 1.0))            # the first pick is replica 0
    assert float(out[0, 0]) == pytest.approx(0.2)
    assert (a.calls, b.calls) == (1, 1)
    assert 0 < b.timeouts[0] <= 1.0                            # the rest of the caller's timeout
    assert sample(metrics, "routerkt_triton_replica_retries_total", reason=kind.value) == 1


def test_a_second_failure_is_not_retried_again() -> None:
    a, b = FakeReplica(0.1), FakeReplica(0.2)
    a.errors = [BackendError(FailureKind.UNAVAILABLE, "first")]
    b.errors = [BackendError(FailureKind.UNAVAILABLE, "second")]
    backend, _ = replicas(a, b)
    with pytest.raises(BackendError, match="second"):
        asyncio.run(backend.infer(KT1, FEEDS, 1.0))
    assert (a.calls, b.calls) == (1, 1)


@pytest.mark.parametrize("kind", [FailureKind.DEADLINE, FailureKind.FAILED, FailureKind.REJECTED])
def test_request_failures_are_not_retried(kind: FailureKind) -> None:
    a, b = FakeReplica(0.1), FakeReplica(0.2)
    a.errors = [BackendError(kind, "boom")]
    backend, _ = replicas(a, b)
    with pytest.raises(BackendError) as info:
        asyncio.run(backend.infer(KT1, FEEDS, 1.0))
    assert info.value.kind is kind and (a.calls, b.calls) == (1, 0)


def test_no_retry_once_the_timeout_has_passed() -> None:
    a, b = FakeReplica(0.1, delay=0.2), FakeReplica(0.2)
    a.errors = [BackendError(FailureKind.UNAVAILABLE, "slow failure")]
    backend, metrics = replicas(a, b)
    with pytest.raises(BackendError, match="slow failure"):
        asyncio.run(backend.infer(KT1, FEEDS, 0.2))
    assert (a.calls, b.calls) == (1, 0)
    assert sample(metrics, "routerkt_triton_replica_retries_total", reason="unavailable") == 0


def test_no_retry_without_another_ready_replica() -> None:
    a, b = FakeReplica(0.1), FakeReplica(0.2, ready={})
    a.errors = [BackendError(FailureKind.UNAVAILABLE, "down")]
    backend, _ = replicas(a, b)
    with pytest.raises(BackendError, match="down"):
        asyncio.run(backend.infer(KT1, FEEDS, 1.0))
    with pytest.raises(BackendError) as info:                 # now nobody serves it
        asyncio.run(backend.infer(KT1, FEEDS, 1.0))
    assert info.value.kind is FailureKind.UNAVAILABLE and b.calls == 0


def test_an_explain_call_goes_to_one_ready_replica_without_a_retry() -> None:
    a, b = FakeReplica(0.1, ready={}), FakeReplica(0.2)
    backend, metrics = replicas(a, b)
    out = asyncio.run(backend.infer_outputs(KT1, FEEDS, ("x", "y"), 1.0))
    assert set(out) == {"x", "y"} and float(out["x"][0, 0]) == pytest.approx(0.2) and (a.calls, b.calls) == (0, 1)
    a.ready = {"kt": {1}}
    a.errors = [BackendError(FailureKind.UNAVAILABLE, "down")]
    b.errors = [BackendError(FailureKind.UNAVAILABLE, "down")]
    with pytest.raises(BackendError, match="down"):
        asyncio.run(backend.infer_outputs(KT1, FEEDS, ("x",), 1.0))
    assert a.calls + b.calls == 2                              # one more call, no retry (an inspection)
    assert sample(metrics, "routerkt_triton_replica_retries_total", reason="unavailable") == 0


def test_readiness_is_the_union_of_the_replicas() -> None:
    a = FakeReplica(0.1, ready={"kt": {1}, "other": {3}})
    b = FakeReplica(0.2, ready={"kt": {2}})
    c = FakeReplica(0.3, ready={})
    backend, _ = replicas(a, b, c)
    assert backend.serving
    assert backend.ready_versions("kt") == {1, 2} and backend.ready_versions("other") == {3}
    assert backend.ready_versions("missing") == frozenset()
    assert backend.ready_models() == {"kt": [1, 2], "other": [3]}
    assert backend.unavailable_reason("kt") is None
    described = backend.describe()
    assert described["triton"] is True
    assert [(r["replica"], r["serving"]) for r in described["replicas"]] == [(0, True), (1, True), (2, False)]
    a.ready, b.ready = {}, {}
    assert not backend.serving and backend.ready_models() == {}
    assert backend.unavailable_reason("kt") == "the inference server is not available; retry shortly"


def test_one_url_gives_the_single_backend_several_the_replica_backend() -> None:
    assert isinstance(triton_backend(Settings(triton_url="127.0.0.1:1").validate(), Metrics()),
                      TritonInferenceBackend)
    backend = triton_backend(Settings(triton_url="127.0.0.1:1, 127.0.0.1:2").validate(), Metrics())
    assert isinstance(backend, TritonReplicaBackend)
    assert [r.backend.client.url for r in backend.replicas] == ["127.0.0.1:1", "127.0.0.1:2"]


@pytest.mark.parametrize("url", ["x", "127.0.0.1:1,", "127.0.0.1:1,127.0.0.1:1", "127.0.0.1:99999", ":5",
                                 "127.0.0.1:1,nope"])
def test_bad_triton_url_lists_are_rejected(url: str) -> None:
    from routerkt.errors import UserError
    with pytest.raises(UserError, match="triton_url"):
        Settings(triton_url=url).validate()


class FakeTritonClient:
    """Stands in for tritonclient.grpc.aio.InferenceServerClient and the inference stub of
    serving/backends/triton/triton_client.py (one model 'kt' version 1)."""

    def __init__(self) -> None:
        self.live = True

    def _check(self) -> None:
        if not self.live:
            raise InferenceServerException(msg="failed to connect", status="StatusCode.UNAVAILABLE")

    async def is_server_live(self, client_timeout=None):
        self._check()
        return True

    async def get_model_repository_index(self, client_timeout=None):
        self._check()
        return SimpleNamespace(models=[SimpleNamespace(name="kt", version="1", state="READY")])

    async def ModelInfer(self, request, timeout=None):  # noqa: N802 - the stub's method name
        if not self.live:
            raise triton_rpc_error("UNAVAILABLE", "failed to connect")
        return triton_answer(request)

    async def close(self):
        pass


def test_readiness_gauges_cover_all_replicas_and_a_down_replica_fails_over() -> None:
    async def scenario():
        metrics = Metrics()
        backend = TritonReplicaBackend(Settings(triton_url="127.0.0.1:1,127.0.0.1:2").validate(), metrics)
        fakes = [FakeTritonClient(), FakeTritonClient()]
        for replica, fake in zip(backend.replicas, fakes):
            replica.backend.client._client = replica.backend.client._infer_stub = fake
        catalog = SimpleNamespace(snapshot=lambda: {"kt": {1: KT1}})
        await backend.start(catalog)
        assert backend.ready_versions("kt") == {1}
        assert sample(metrics, "routerkt_triton_replica_up", replica="0") == 1
        fakes[1].live = False                                 # replica 1 dies: only its supervisor notices
        for replica in backend.replicas:
            await replica.backend.supervisor.probe(catalog.snapshot())
        backend.refresh_gauges()
        assert sample(metrics, "routerkt_triton_ready") == 1 and sample(metrics, "routerkt_model_ready", model="kt") == 1
        assert sample(metrics, "routerkt_triton_replica_up", replica="1") == 0
        assert backend.describe()["replicas"][1]["triton"] is False
        for _ in range(4):
            await backend.infer(KT1, FEEDS, 1.0)
        assert sample(metrics, "routerkt_triton_replica_inferences_total", replica="1") == 0
        fakes[0].live = False                                 # both down: on the request path, then probes
        with pytest.raises(BackendError):
            await backend.infer(KT1, FEEDS, 1.0)
        backend.refresh_gauges()
        assert sample(metrics, "routerkt_triton_ready") == 0 and sample(metrics, "routerkt_model_ready", model="kt") == 0
        assert not backend.serving
        await backend.close()
    asyncio.run(scenario())


def test_step_calls_take_turns_and_fail_over_like_inferences() -> None:
    a, b = SteppingReplica(0.1), SteppingReplica(0.2)
    backend, metrics = replicas(a, b)
    assert backend.steps(KT1) and not replicas(SteppingReplica(0.1), FakeReplica(0.2))[0].steps(KT1)

    async def scenario():
        return [await backend.infer_step(KT1, "step_next", FEEDS, 1.0) for _ in range(4)]
    answers = asyncio.run(scenario())
    assert (a.calls, b.calls) == (2, 2) and {str(out["graph"][0]) for out in answers} == {"step_next"}
    a.errors = [BackendError(FailureKind.UNAVAILABLE, "boom")]
    out = asyncio.run(backend.infer_step(KT1, "step_start", FEEDS, 1.0))
    assert float(out["candidate_probs"][0, 0]) == pytest.approx(0.2)
    assert sample(metrics, "routerkt_triton_replica_retries_total", reason="unavailable") == 1


class HoldingReplica(SteppingReplica):
    """A replica that holds states: it answers each row with its value and remembers the keys it saw."""

    def holds_states(self, model) -> bool:
        return True

    async def infer_step(self, model: ModelVersion, graph: str, feeds, timeout_s: float) -> dict[str, np.ndarray]:
        keys = feeds.get("state_ref", feeds.get("keep_as"))
        self.seen = getattr(self, "seen", []) + keys.tolist()
        rows = {"questions": np.zeros((keys.shape[0], 4), dtype=np.int64)}
        probs = await self.infer(model, rows, timeout_s)
        return {"candidate_probs": probs[:, :1] + keys[:, None].astype(np.float32) * 0}


def test_a_held_call_goes_to_its_slots_replica_and_mixed_rows_are_split() -> None:
    a, b = HoldingReplica(0.1), HoldingReplica(0.2)
    backend, _ = replicas(a, b)
    assert backend.holds_states(KT1) and not replicas(HoldingReplica(0.1), SteppingReplica(0.2))[0].holds_states(KT1)
    owner = {slot: backend.holder(KT1, slot) for slot in range(256)}
    assert {r.index for r in owner.values()} == {0, 1}               # slots spread over both
    on_a = next(s for s, r in owner.items() if r.index == 0)
    on_b = next(s for s, r in owner.items() if r.index == 1)
    keys = np.array([(7 << 8) | on_a, (9 << 8) | on_b, (11 << 8) | on_a], dtype=np.int64)
    out = asyncio.run(backend.infer_step(KT1, "held_next", {"state_ref": keys, "state_length": keys}, 1.0))
    np.testing.assert_allclose(out["candidate_probs"][:, 0], [0.1, 0.2, 0.1])
    assert (sorted(a.seen), b.seen) == (sorted([int(keys[0]), int(keys[2])]), [int(keys[1])])
    for _ in range(3):                                                 # always the same replica, no turns
        asyncio.run(backend.infer_step(KT1, "held_next", {"state_ref": keys[:1], "state_length": keys[:1]}, 1.0))
    assert a.calls == 4 and b.calls == 1


def test_a_held_key_on_a_failed_replica_is_lost_and_a_start_moves_to_the_next() -> None:
    a, b = HoldingReplica(0.1), HoldingReplica(0.2)
    backend, _ = replicas(a, b)
    slot = next(s for s in range(256) if backend.holder(KT1, s).index == 0)
    key = np.array([(5 << 8) | slot], dtype=np.int64)
    a.errors = [BackendError(FailureKind.UNAVAILABLE, "gone")]
    with pytest.raises(BackendError) as lost:
        asyncio.run(backend.infer_step(KT1, "held_next", {"state_ref": key, "state_length": key}, 1.0))
    assert lost.value.kind is FailureKind.STATE_LOST
    assert backend.holder(KT1, slot).index == 1                         # replica 0 is down now
    a.ready, a.errors = {"kt": {1}}, [BackendError(FailureKind.UNAVAILABLE, "gone again")]
    out = asyncio.run(backend.infer_step(KT1, "held_start", {"keep_as": key}, 1.0))
    assert float(out["candidate_probs"][0, 0]) == pytest.approx(0.2) and b.seen == [int(key[0])]
