"""The gateway's client of one Triton server: inference with a timeout, the repository index, and
model control, over `tritonclient.grpc.aio`. It holds no readiness state (serving/triton_supervisor.py
does) and turns every Triton failure into a BackendError whose `detail` (Triton's text, which carries
paths and tracebacks) is for the log only.

One channel, reconnect backoff capped at 1 s, so a restarted Triton on the same address is found
again quickly. Tensor names and dtypes come from the contract's graph the model serves.
"""
from __future__ import annotations

import time

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from routerkt.contract.signature import Graph
from serving.metrics import Metrics
from serving.parts import BackendError, FailureKind

STUB_UNHEALTHY = "is not healthy"          # "Stub process '<model>_0_0' is not healthy."
MAX_GRPC_MESSAGE = 2**31 - 1


def classify(exc: InferenceServerException) -> FailureKind:
    status = (exc.status() or "").rsplit(".", 1)[-1]
    message = exc.message() or ""
    if status == "DEADLINE_EXCEEDED":
        return FailureKind.DEADLINE
    if status in ("UNAVAILABLE", "CANCELLED"):
        return FailureKind.UNAVAILABLE
    if status == "NOT_FOUND":
        return FailureKind.NOT_LOADED
    if STUB_UNHEALTHY in message:
        return FailureKind.STUB_CRASHED
    if status in ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "UNIMPLEMENTED"):
        return FailureKind.REJECTED
    return FailureKind.FAILED


def channel_args() -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE),
        ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]


class TritonClient:
    """Stateless calls to the Triton at `url` (create, use and close inside one event loop)."""

    def __init__(self, url: str, metrics: Metrics) -> None:
        self.url = url
        self.metrics = metrics
        self._client: grpcaio.InferenceServerClient | None = None

    async def connect(self) -> None:
        if self._client is None:
            self._client = grpcaio.InferenceServerClient(self.url, channel_args=channel_args())

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    @property
    def raw(self) -> grpcaio.InferenceServerClient:
        if self._client is None:
            raise RuntimeError("TritonClient.connect() was not awaited")
        return self._client

    async def infer(self, model: str, version: int, graph: Graph, feeds: dict[str, np.ndarray], timeout_s: float,
                    observe: bool = True) -> np.ndarray:
        """`graph`'s output, float32 [rows, ...], for its int64 inputs `feeds`; BackendError on failure.
        `observe`: record the round trip in routerkt_triton_request_seconds (not for probes)."""
        inputs = []
        for spec in graph.inputs:
            array = feeds[spec.name]
            tensor = grpcclient.InferInput(spec.name, list(array.shape), spec.onnx_dtype)
            tensor.set_data_from_numpy(np.ascontiguousarray(array, dtype=spec.dtype))
            inputs.append(tensor)
        output = graph.outputs[0].name
        started = time.perf_counter()
        try:
            result = await self.raw.infer(model, inputs, model_version=str(version),
                                          outputs=[grpcclient.InferRequestedOutput(output)], client_timeout=timeout_s)
        except InferenceServerException as exc:
            raise BackendError(classify(exc), exc.message() or str(exc)) from None
        finally:
            if observe:
                self.metrics.triton_seconds.labels(model=model, version=str(version)).observe(
                    time.perf_counter() - started)
        probs = result.as_numpy(output)
        rows = feeds[graph.inputs[0].name].shape[0]
        if probs is None or probs.ndim != 2 or probs.shape[0] != rows:
            shape = None if probs is None else probs.shape
            raise BackendError(FailureKind.FAILED, f"output {output} has shape {shape}, expected {rows} rows")
        return probs

    async def model_states(self, timeout_s: float) -> dict[str, dict[int, str]] | None:
        """model -> version -> Triton's state ("READY", ...), or None when Triton is not live.
        Liveness, not readiness: with strict readiness one model loading or unloading makes the
        server "not ready", while the other models still serve."""
        try:
            live = await self.raw.is_server_live(client_timeout=timeout_s)
            index = await self.raw.get_model_repository_index(client_timeout=timeout_s)
        except InferenceServerException as exc:
            raise BackendError(FailureKind.UNAVAILABLE, exc.message() or str(exc)) from None
        if not live or index is None:
            return None
        states: dict[str, dict[int, str]] = {}
        for entry in index.models:
            if entry.version.isdigit():
                states.setdefault(entry.name, {})[int(entry.version)] = entry.state
        return states

    async def load(self, model: str, timeout_s: float) -> None:
        await self.raw.load_model(model, client_timeout=timeout_s)

    async def unload(self, model: str, timeout_s: float) -> None:
        await self.raw.unload_model(model, client_timeout=timeout_s)
