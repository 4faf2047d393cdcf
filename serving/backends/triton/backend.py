"""The production inference backend: a Triton server, reached through TritonClient
(serving/backends/triton/client.py), with its readiness and recovery kept by TritonSupervisor
(serving/backends/triton/supervisor.py). Inference failures are reported to the supervisor, which updates
readiness and schedules reloads; the caller gets the BackendError."""
from __future__ import annotations

import logging

import numpy as np

from serving.catalog import ModelCatalog, ModelVersion
from serving.errors import shown
from serving.metrics import Metrics
from serving.parts import BackendError
from serving.settings import Settings
from serving.backends.triton.client import TritonClient, control_headers
from serving.backends.triton.supervisor import TritonSupervisor

log = logging.getLogger("routerkt.gateway.triton")


class TritonInferenceBackend:
    """InferenceBackend over one Triton server."""

    def __init__(self, settings: Settings, metrics: Metrics, client: TritonClient | None = None) -> None:
        self.settings = settings
        self.client = client or TritonClient(settings.triton_url, metrics, control_headers(settings.triton_key_file))
        self.supervisor = TritonSupervisor(settings, metrics, self.client)

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

    def unavailable_reason(self, model: str) -> str | None:
        if self.supervisor.is_reloading(model):
            return f"model {shown(model)} is being reloaded; retry shortly"
        if not self.supervisor.triton_ready:
            return "the inference server is not available; retry shortly"
        return None

    def describe(self) -> dict[str, object]:
        return {"triton": self.supervisor.triton_ready}

    async def infer(self, model: ModelVersion, feeds: dict[str, np.ndarray], timeout_s: float) -> np.ndarray:
        try:
            async with self.supervisor.gates.admitted(model.name, timeout_s) as left:
                return await self.client.infer(model.name, model.version, model.graph, feeds, left)
        except BackendError as exc:
            self.supervisor.on_failure(model.name, model.version, exc)
            raise

    async def infer_outputs(self, model: ModelVersion, feeds: dict[str, np.ndarray], outputs: tuple[str, ...],
                            timeout_s: float) -> dict[str, np.ndarray]:
        """Several outputs of the model's config (the explain call: serving/explain.py)."""
        try:
            async with self.supervisor.gates.admitted(model.name, timeout_s) as left:
                return await self.client.infer_outputs(model.name, model.version, model.graph, feeds, outputs, left)
        except BackendError as exc:
            self.supervisor.on_failure(model.name, model.version, exc)
            raise
