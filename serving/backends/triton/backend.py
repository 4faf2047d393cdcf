"""The production inference backend: a Triton server, reached through TritonClient
(serving/backends/triton/triton_client.py), with its readiness and recovery kept by TritonSupervisor
(serving/backends/triton/supervisor.py). Inference failures are reported to the supervisor, which updates
readiness and schedules reloads; the caller gets the BackendError.

An inference that fails as UNAVAILABLE or NOT_LOADED (Triton unreachable for a moment, or the
version not READY: a load bringing it up) is sent once more after RETRY_PAUSE_S, through the gate
again (a load that closed it meanwhile is waited for), when MIN_RETRY_S of its timeout is left
after the pause: predictions and explanations are reads, so a repeat is harmless. Only the last
failure is reported to the supervisor."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import numpy as np

from routerkt.contract.step_signature import STEP_GRAPHS
from serving.core.catalog import ModelCatalog, ModelVersion
from serving.status_errors import shown
from serving.metrics import Metrics
from serving.pipeline.parts import BackendError, FailureKind
from serving.settings import Settings
from serving.backends.triton.triton_client import TritonClient, TritonTLS, control_headers, triton_tls
from serving.backends.triton.supervisor import TritonSupervisor

log = logging.getLogger("routerkt.gateway.triton")

RETRIED = frozenset({FailureKind.UNAVAILABLE, FailureKind.NOT_LOADED})
RETRY_PAUSE_S = 0.05       # wait before the one repeat of an inference
MIN_RETRY_S = 0.05         # the repeat needs at least this much of the call's timeout after the pause
LOG_EVERY_S = 5.0          # at most one "repeated an inference" line this often
T = TypeVar("T")


def tls_of(settings: Settings) -> TritonTLS | None:
    """How the gateway's channels to Triton are secured (settings.triton_tls_*), None: plaintext."""
    return triton_tls(settings.triton_tls_ca, settings.triton_tls_cert, settings.triton_tls_key)


class TritonInferenceBackend:
    """InferenceBackend over one Triton server."""

    def __init__(self, settings: Settings, metrics: Metrics, client: TritonClient | None = None) -> None:
        self.settings = settings
        self.client = client or TritonClient(settings.triton_url, metrics, control_headers(settings.triton_key_file),
                                             tls_of(settings))
        self.supervisor = TritonSupervisor(settings, metrics, self.client)
        self._logged = -LOG_EVERY_S

    async def start(self, catalog: ModelCatalog) -> None:
        await self.client.connect()
        await self.supervisor.probe(catalog.snapshot())

    async def maintain(self, catalog: ModelCatalog) -> None:
        while True:
            await self.supervisor.wait_wake(self.settings.probe_interval_s)
            try:
                await self.supervisor.probe(catalog.snapshot())
            except Exception:                              # never let the loop die
                log.exception("readiness probe failed")

    def wake(self) -> None:
        self.supervisor.wake()

    async def close(self) -> None:
        await self.supervisor.close()
        await self.client.close()

    @property
    def serving(self) -> bool:
        return self.supervisor.serving

    def ready_versions(self, model: str) -> frozenset[int]:
        return self.supervisor.ready_versions(model)

    def ready_models(self) -> dict[str, list[int]]:
        return self.supervisor.ready_models()

    async def ensure_ready(self, model: str, version: int, timeout_s: float) -> bool:
        return await self.supervisor.ensure_loaded(model, version, timeout_s)

    def unavailable_reason(self, model: str) -> str | None:
        if self.supervisor.is_reloading(model):
            return f"model {shown(model)} is being reloaded; retry shortly"
        if not self.supervisor.triton_ready:
            return "the inference server is not available; retry shortly"
        return None

    def describe(self) -> dict[str, object]:
        return {"triton": self.supervisor.triton_ready}

    async def infer(self, model: ModelVersion, feeds: dict[str, np.ndarray], timeout_s: float) -> np.ndarray:
        return await self._call(model, timeout_s, lambda left: self.client.infer(
            model.name, model.version, model.graph, feeds, left))

    async def infer_outputs(self, model: ModelVersion, feeds: dict[str, np.ndarray], outputs: tuple[str, ...],
                            timeout_s: float) -> dict[str, np.ndarray]:
        """Several outputs of the model's config (the explain call: serving/queries/explain.py)."""
        return await self._call(model, timeout_s, lambda left: self.client.infer_outputs(
            model.name, model.version, model.graph, feeds, outputs, left))

    def steps(self, model: ModelVersion) -> bool:
        """The version holds step graphs and its config.pbtxt serves them (`routerkt export --step-graphs`):
        the learner-state path (serving/state/) sends each learner's state with the request, or its key."""
        return model.step_state is not None and model.step_served

    def holds_states(self, model: ModelVersion) -> bool:
        """The version's config.pbtxt declares the held-state inputs: model.py keeps the learner states."""
        return self.steps(model) and model.state_held

    async def infer_step(self, model: ModelVersion, graph: str, feeds: dict[str, np.ndarray],
                         timeout_s: float) -> dict[str, np.ndarray]:
        """Every output of the step graph `graph`, by name (the rank model runs it: its inputs say which)."""
        if not self.steps(model):
            raise BackendError(FailureKind.REJECTED, f"{model.name} version {model.version} serves no step graphs")
        spec = STEP_GRAPHS[model.step_state].graph(graph)
        return await self._call(model, timeout_s, lambda left: self.client.infer_graph(
            model.name, model.version, spec, feeds, left))

    async def _call(self, model: ModelVersion, timeout_s: float, send: Callable[[float], Awaitable[T]]) -> T:
        """`send(seconds left)` inside the model's gate, repeated once on a RETRIED failure (module docstring)."""
        started = time.monotonic()
        try:
            async with self.supervisor.gates.admitted(model.name, timeout_s) as left:
                return await send(left)
        except BackendError as exc:
            remaining = timeout_s - (time.monotonic() - started) - RETRY_PAUSE_S
            if exc.kind not in RETRIED or remaining < MIN_RETRY_S:
                self.supervisor.on_failure(model.name, model.version, exc)
                raise
            first = exc
        await asyncio.sleep(RETRY_PAUSE_S)
        try:
            async with self.supervisor.gates.admitted(model.name, remaining) as left:
                result = await send(left)
        except BackendError as exc:
            self.supervisor.on_failure(model.name, model.version, exc)
            raise
        now = time.monotonic()
        if now - self._logged >= LOG_EVERY_S:
            self._logged = now
            log.info("model %s version %d: an inference answered when repeated after %s (logged at most every "
                     "%.0fs)", model.name, model.version, first.kind.value, LOG_EVERY_S)
        return result
