"""The Triton inference backend and its supervisor against a fake tritonclient: readiness probe,
stub-crash detection -> one guarded unload+load, reload counting and cooldown."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from serving.metrics import Metrics
from serving.backends.triton.backend import TritonInferenceBackend
from serving.core.catalog import ModelVersion
from serving.pipeline.parts import BackendError, FailureKind
from serving.settings import Settings
from serving.backends.triton.triton_client import classify, classify_status
from routerkt.contract.vocab import Vocab
from tests.helpers import triton_answer, triton_rpc_error

pytestmark = pytest.mark.unit

STUB_ERROR = "Failed to process the request(s) for model 'kt_0_0', message: Stub process 'kt_0_0' is not healthy."


def error(status: str, message: str = "boom") -> InferenceServerException:
    return InferenceServerException(msg=message, status=f"StatusCode.{status}")


@pytest.mark.parametrize("exc, kind", [
    (error("DEADLINE_EXCEEDED", "Deadline Exceeded"), FailureKind.DEADLINE),
    (error("UNAVAILABLE", "failed to connect to all addresses"), FailureKind.UNAVAILABLE),
    (error("CANCELLED", "Socket closed"), FailureKind.UNAVAILABLE),
    (error("NOT_FOUND", "Request for unknown model: 'kt' has no available versions"), FailureKind.NOT_LOADED),
    # Triton 2.51's answer for a version it knows but has not READY (measured): that version, not the server
    (error("UNAVAILABLE", "Request for unknown model: 'kt' version 1 is not at ready state"), FailureKind.NOT_LOADED),
    (error("INTERNAL", STUB_ERROR), FailureKind.STUB_CRASHED),
    (error("INVALID_ARGUMENT", "unexpected shape"), FailureKind.REJECTED),
    # model.py's answer for a held key it does not hold: the caller rebuilds, the model is fine
    (error("NOT_FOUND", "state not held: a state_ref is not kept here (evicted, or a new model instance)"),
     FailureKind.STATE_LOST),
    (error("INTERNAL", "model execution failed"), FailureKind.FAILED),
])
def test_classify(exc: InferenceServerException, kind: FailureKind) -> None:
    assert classify(exc) is kind
    assert classify_status(exc.status().rsplit(".", 1)[-1], exc.message()) is kind    # the inference path's form


class FakeClient:
    """Stands in for tritonclient.grpc.aio.InferenceServerClient (control calls) and for the
    GRPCInferenceServiceStub that TritonClient sends inferences through."""

    def __init__(self) -> None:
        self.live = True
        self.state = "READY"
        self.infer_error: InferenceServerException | None = None
        self.unloads = 0
        self.loads = 0
        self.load_delay = 0.05

    async def is_server_live(self, client_timeout=None):
        if not self.live:
            raise error("UNAVAILABLE", "failed to connect")
        return True

    async def get_model_repository_index(self, client_timeout=None):
        if not self.live:
            raise error("UNAVAILABLE", "failed to connect")
        return SimpleNamespace(models=[SimpleNamespace(name="kt", version="1", state=self.state)])

    async def ModelInfer(self, request, timeout=None):  # noqa: N802 - the stub's method name
        if self.infer_error is not None:
            raise triton_rpc_error(self.infer_error.status().rsplit(".", 1)[-1], self.infer_error.message())
        return triton_answer(request)

    async def unload_model(self, model, client_timeout=None):
        self.unloads += 1
        self.state = "UNAVAILABLE"

    async def load_model(self, model, client_timeout=None):
        await asyncio.sleep(self.load_delay)
        self.loads += 1
        self.state = "READY"
        self.infer_error = None                   # a fresh stub

    async def close(self):
        pass


TABLE = {"kt": {1: ModelVersion(name="kt", version=1, window=4, max_batch_size=8,
                                vocab=Vocab(questions={}, skills={}, question_skill={}))}}


def make_backend(**overrides) -> tuple[TritonInferenceBackend, FakeClient, Metrics]:
    settings = Settings(reload_cooldown_s=overrides.pop("cooldown", 0.0), **overrides).validate()
    metrics = Metrics()
    backend = TritonInferenceBackend(settings, metrics)
    client = FakeClient()
    backend.client._client = backend.client._infer_stub = client
    return backend, client, metrics


async def settle(backend: TritonInferenceBackend) -> None:
    for _ in range(100):
        if not backend.supervisor._tasks:
            return
        await asyncio.sleep(0.01)


def reloads(metrics: Metrics, reason: str) -> float:
    return metrics.registry.get_sample_value("routerkt_model_reloads_total", {"model": "kt", "reason": reason}) or 0.0


def test_probe_marks_ready_and_triton_down_clears_everything() -> None:
    async def scenario():
        backend, client, metrics = make_backend()
        await backend.supervisor.probe(TABLE)
        assert backend.serving and backend.ready_versions("kt") == {1}
        assert metrics.registry.get_sample_value("routerkt_model_ready", {"model": "kt"}) == 1
        client.live = False
        await backend.supervisor.probe(TABLE)
        assert not backend.serving and not backend.supervisor.triton_ready and backend.ready_versions("kt") == frozenset()
        assert metrics.registry.get_sample_value("routerkt_triton_ready") == 0
    asyncio.run(scenario())


def test_stub_crash_on_the_request_path_triggers_exactly_one_reload() -> None:
    async def scenario():
        backend, client, metrics = make_backend()
        await backend.supervisor.probe(TABLE)
        client.infer_error = error("INTERNAL", STUB_ERROR)
        rows = np.zeros((2, 4), dtype=np.int64)
        results = await asyncio.gather(*(backend.infer(TABLE["kt"][1], {"questions": rows, "skills": rows, "responses": rows}, 1.0) for _ in range(5)),
                                       return_exceptions=True)
        assert all(isinstance(r, BackendError) and r.kind is FailureKind.STUB_CRASHED for r in results)
        assert backend.ready_versions("kt") == frozenset()
        await settle(backend)
        assert client.unloads == 1 and client.loads == 1
        assert reloads(metrics, "stub_crash") == 1
        await backend.supervisor.probe(TABLE)
        assert backend.ready_versions("kt") == {1}
    asyncio.run(scenario())


def test_probe_detects_a_crashed_stub_while_triton_says_ready() -> None:
    async def scenario():
        backend, client, metrics = make_backend()
        client.infer_error = error("INTERNAL", STUB_ERROR)
        await backend.supervisor.probe(TABLE)
        assert backend.ready_versions("kt") == frozenset()
        await settle(backend)
        assert reloads(metrics, "stub_crash") == 1
    asyncio.run(scenario())


def test_repeated_probe_failures_reload_after_the_threshold() -> None:
    async def scenario():
        backend, client, metrics = make_backend(probe_failures_before_reload=2)
        await backend.supervisor.probe(TABLE)
        client.infer_error = error("INTERNAL", "model execution failed")
        await backend.supervisor.probe(TABLE)
        await settle(backend)
        assert reloads(metrics, "probe_failed") == 0 and backend.ready_versions("kt") == {1}
        await backend.supervisor.probe(TABLE)
        await settle(backend)
        assert reloads(metrics, "probe_failed") == 1 and client.loads == 1
    asyncio.run(scenario())


def test_cooldown_limits_reloads() -> None:
    async def scenario():
        backend, client, metrics = make_backend(cooldown=60.0)
        assert await backend.supervisor.reload("kt", "stub_crash") is True
        assert await backend.supervisor.reload("kt", "stub_crash") is False
        assert client.unloads == 1 and reloads(metrics, "stub_crash") == 1
    asyncio.run(scenario())


def test_unreachable_triton_on_the_request_path_marks_everything_down() -> None:
    async def scenario():
        backend, client, _ = make_backend()
        await backend.supervisor.probe(TABLE)
        client.infer_error = error("UNAVAILABLE", "failed to connect to all addresses")
        rows = np.zeros((1, 4), dtype=np.int64)
        with pytest.raises(BackendError) as info:
            await backend.infer(TABLE["kt"][1], {"questions": rows, "skills": rows, "responses": rows}, 1.0)
        assert info.value.kind is FailureKind.UNAVAILABLE and not backend.supervisor.triton_ready
    asyncio.run(scenario())


def test_manage_models_loads_a_model_triton_does_not_serve() -> None:
    async def scenario():
        backend, client, _ = make_backend()
        client.state = "UNAVAILABLE"
        await backend.supervisor.probe(TABLE)
        await settle(backend)
        assert client.loads == 1
        await backend.supervisor.probe(TABLE)
        assert backend.ready_versions("kt") == {1}
    asyncio.run(scenario())
