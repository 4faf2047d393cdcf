"""The gateway's client of one Triton server: inference with a timeout, the repository index, and
model control, over `tritonclient.grpc.aio`. It holds no readiness state (serving/backends/triton/supervisor.py
does) and turns every Triton failure into a BackendError whose `detail` (Triton's text, which carries
paths and tracebacks) is for the log only.

Inference goes over its own channel with a request prepared once per (model, version, graph):
each call copies it and adds only the shapes and raw bytes of the inputs, instead of building
tritonclient's InferInput objects and request anew (about 30 us less per call); the answer is read
straight from the response's raw output bytes. Control calls (index, load, unload) use
tritonclient's aio client and carry `control_headers` (the key of Triton's
--grpc-restricted-protocol for model-repository, from settings.triton_key_file, as the metadata
`triton-grpc-protocol-<header>` Triton's gRPC server expects). Both channels back off at most 1 s
between reconnects, so a restarted Triton on the same address is found again quickly. Tensor names
and dtypes come from the contract's graph the model serves.

With a TritonTLS (settings.triton_tls_ca / _cert / _key: `routerkt serve --triton-tls-*`) both
channels are TLS channels built from one set of credentials: the server's certificate is verified
against the CA (the system roots without one), and with a certificate and key the client presents
them (Triton's --grpc-use-ssl-mutual). The files are read at connect(); a renewed client
certificate takes a gateway restart, a renewed Triton certificate from the same CA does not.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from routerkt.contract.signature import Graph
from routerkt.contract.step_signature import STATE_NOT_HELD
from serving.metrics import Metrics, labelled
from serving.pipeline.parts import BackendError, FailureKind
from serving.security.triton_access import TRITON_KEY_HEADER, grpc_headers  # noqa: F401

STUB_UNHEALTHY = "is not healthy"          # "Stub process '<model>_0_0' is not healthy."
# Triton answers UNAVAILABLE, not NOT_FOUND, for a version it knows but has not READY (loading,
# unloading, unloaded, failed): "Request for unknown model: 'kt' version 1 is not at ready state".
# Only that version is out, not the server.
VERSION_NOT_READY = "is not at ready state"
MAX_GRPC_MESSAGE = 2**31 - 1


def classify(exc: InferenceServerException) -> FailureKind:
    return classify_status(exc.status() or "", exc.message() or "")


def classify_status(status: str, message: str) -> FailureKind:
    """The failure kind of a Triton answer with gRPC status `status` ("DEADLINE_EXCEEDED" or
    "StatusCode.DEADLINE_EXCEEDED") and text `message`."""
    status = status.rsplit(".", 1)[-1]
    if status == "DEADLINE_EXCEEDED":
        return FailureKind.DEADLINE
    if status == "UNAVAILABLE" and VERSION_NOT_READY in message:
        return FailureKind.NOT_LOADED
    if status in ("UNAVAILABLE", "CANCELLED"):
        return FailureKind.UNAVAILABLE
    if status == "NOT_FOUND" and STATE_NOT_HELD in message:
        return FailureKind.STATE_LOST            # a held key the model no longer holds (step_signature.py)
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


def control_headers(key_file) -> dict[str, str] | None:
    """The gRPC metadata proving the key of `key_file` (KEY or HEADER=KEY) to Triton's
    --grpc-restricted-protocol (serving/security/triton_access.py), or None without a file. The key
    is never logged."""
    return grpc_headers(key_file)


@dataclass(frozen=True)
class TritonTLS:
    """How the gateway's channels to Triton are secured: `ca` verifies Triton's certificate (None:
    the system roots); `cert` and `key` (both or neither) are the gateway's client certificate for
    Triton's mutual TLS."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("a Triton client certificate needs its key (and the key its certificate)")

    def credentials(self) -> grpc.ChannelCredentials:
        """The channel credentials, the files read now (OSError when one cannot be read)."""
        def read(path: Path | None) -> bytes | None:
            return None if path is None else Path(path).read_bytes()
        return grpc.ssl_channel_credentials(root_certificates=read(self.ca), private_key=read(self.key),
                                            certificate_chain=read(self.cert))


def triton_tls(ca: Path | None, cert: Path | None, key: Path | None) -> TritonTLS | None:
    """The TritonTLS of the settings' three paths, or None (plaintext) when none is set."""
    if ca is None and cert is None and key is None:
        return None
    return TritonTLS(ca, cert, key)


class TritonClient:
    """Stateless calls to the Triton at `url` (create, use and close inside one event loop); over
    TLS when `tls` is given."""

    def __init__(self, url: str, metrics: Metrics, headers: dict[str, str] | None = None,
                 tls: TritonTLS | None = None) -> None:
        self.url = url
        self.metrics = metrics
        self._seconds = labelled(metrics.triton_seconds)
        self.headers = headers                     # sent on the repository index, load and unload
        self.tls = tls
        self._control = {"headers": headers} if headers else {}
        self._client: grpcaio.InferenceServerClient | None = None
        self._channel: grpc.aio.Channel | None = None
        self._infer_stub: service_pb2_grpc.GRPCInferenceServiceStub | None = None
        self._prepared: dict[tuple[str, int, str], service_pb2.ModelInferRequest] = {}

    async def connect(self) -> None:
        if self._client is None:
            if self.tls is None:
                self._client = grpcaio.InferenceServerClient(self.url, channel_args=channel_args())
                self._channel = grpc.aio.insecure_channel(self.url, options=channel_args())
            else:
                creds = self.tls.credentials()
                self._client = grpcaio.InferenceServerClient(self.url, channel_args=channel_args(), creds=creds)
                self._channel = grpc.aio.secure_channel(self.url, creds, options=channel_args())
            self._infer_stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            await self._channel.close()
            self._client = self._channel = self._infer_stub = None

    @property
    def raw(self) -> grpcaio.InferenceServerClient:
        if self._client is None:
            raise RuntimeError("TritonClient.connect() was not awaited")
        return self._client

    def request(self, model: str, version: int, graph: Graph, feeds: dict[str, np.ndarray],
                outputs: tuple[str, ...] = ()) -> service_pb2.ModelInferRequest:
        """The ModelInferRequest for `feeds`: a copy of the one prepared for (model, version, graph)
        (names, dtypes, output; built once) plus the inputs' shapes and raw bytes. `outputs`: the
        outputs to ask for (default: the graph's first)."""
        key = (model, version, graph.name, outputs)
        if key not in self._prepared:
            prepared = service_pb2.ModelInferRequest(model_name=model, model_version=str(version))
            for spec in graph.inputs:
                prepared.inputs.add(name=spec.name, datatype=spec.onnx_dtype)
            for name in outputs or (graph.outputs[0].name,):
                prepared.outputs.add(name=name)
            self._prepared[key] = prepared
        request = service_pb2.ModelInferRequest()
        request.CopyFrom(self._prepared[key])
        # a per-row scalar (one axis: batch) travels as [rows, 1]: Triton needs a dim (config.pbtxt reshapes it)
        arrays = [np.ascontiguousarray(feeds[spec.name], dtype=spec.dtype) for spec in graph.inputs]
        arrays = [a if spec.axes[1:] else a.reshape(-1, 1) for a, spec in zip(arrays, graph.inputs)]
        for tensor, array in zip(request.inputs, arrays):
            tensor.shape.extend(array.shape)
        request.raw_input_contents.extend([array.tobytes() for array in arrays])
        return request

    async def infer(self, model: str, version: int, graph: Graph, feeds: dict[str, np.ndarray], timeout_s: float,
                    observe: bool = True) -> np.ndarray:
        """`graph`'s output, float32 [rows, ...], for its int64 inputs `feeds`; BackendError on failure.
        `observe`: record the round trip in routerkt_triton_request_seconds (not for probes)."""
        response = await self._call(self.request(model, version, graph, feeds), timeout_s, observe)
        rows = feeds[graph.inputs[0].name].shape[0]
        probs = _output(response)                                    # float32 [rows, ...]
        if probs is None or probs.ndim != 2 or probs.shape[0] != rows:
            shape = None if probs is None else probs.shape
            raise BackendError(FailureKind.FAILED, f"output {graph.outputs[0].name} has shape {shape}, "
                                                   f"expected {rows} rows")
        return probs

    async def infer_outputs(self, model: str, version: int, graph: Graph, feeds: dict[str, np.ndarray],
                            outputs: tuple[str, ...], timeout_s: float) -> dict[str, np.ndarray]:
        """The FP32 `outputs` (name -> array of its shape) for `feeds`: the explain call (the rank
        model's explain outputs, serving/queries/explain.py); BackendError on failure."""
        response = await self._call(self.request(model, version, graph, feeds, outputs), timeout_s, True)
        got = {}
        for tensor, data in zip(response.outputs, response.raw_output_contents):
            shape = tuple(tensor.shape)
            if tensor.datatype != "FP32" or len(data) != 4 * math.prod(shape):
                raise BackendError(FailureKind.FAILED, f"output {tensor.name} is not FP32 {list(shape)}")
            got[tensor.name] = np.frombuffer(data, dtype=np.float32).reshape(shape)
        rows = feeds[graph.inputs[0].name].shape[0]
        if set(got) != set(outputs) or any(a.shape[0] != rows for a in got.values()):
            raise BackendError(FailureKind.FAILED, f"outputs {sorted(got)}, expected {list(outputs)} of {rows} rows")
        return got

    async def infer_graph(self, model: str, version: int, graph: Graph, feeds: dict[str, np.ndarray],
                          timeout_s: float) -> dict[str, np.ndarray]:
        """Every output of `graph` (name -> array of the contract's dtype; a per-row scalar as [rows]) for
        `feeds`: the step graphs a rank model serves too (serving/state/); BackendError on failure."""
        response = await self._call(self.request(model, version, graph, feeds, graph.output_names), timeout_s, True)
        specs = {t.name: t for t in graph.outputs}
        rows = feeds[graph.inputs[0].name].shape[0]
        got = {}
        for tensor, data in zip(response.outputs, response.raw_output_contents):
            spec, shape = specs.get(tensor.name), tuple(tensor.shape)
            dtype = np.dtype(spec.dtype) if spec is not None else None
            if dtype is None or tensor.datatype != spec.onnx_dtype or len(data) != dtype.itemsize * math.prod(shape):
                raise BackendError(FailureKind.FAILED, f"output {tensor.name} is not {list(shape)} of the "
                                                       f"{graph.name} graph")
            array = np.frombuffer(data, dtype=dtype).reshape(shape)
            got[tensor.name] = array.reshape(rows) if not spec.axes[1:] and array.size == rows else array
        if set(got) != set(specs) or any(a.shape[0] != rows for a in got.values()):
            raise BackendError(FailureKind.FAILED, f"outputs {sorted(got)}, expected {list(specs)} of {rows} rows")
        return got

    async def _call(self, request: service_pb2.ModelInferRequest, timeout_s: float,
                    observe: bool) -> service_pb2.ModelInferResponse:
        """One ModelInfer round trip (BackendError on failure), timed in routerkt_triton_request_seconds."""
        if self._infer_stub is None:
            raise RuntimeError("TritonClient.connect() was not awaited")
        started = time.perf_counter()
        try:
            return await self._infer_stub.ModelInfer(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            code, detail = exc.code().name, exc.details() or ""
            raise BackendError(classify_status(code, detail), f"{code}: {detail}") from None
        finally:
            if observe:
                self._seconds(model=request.model_name, version=request.model_version).observe(
                    time.perf_counter() - started)

    async def model_states(self, timeout_s: float) -> dict[str, dict[int, str]] | None:
        """model -> version -> Triton's state ("READY", ...), or None when Triton is not live.
        Liveness, not readiness: with strict readiness one model loading or unloading makes the
        server "not ready", while the other models still serve."""
        try:
            live = await self.raw.is_server_live(client_timeout=timeout_s)
            index = await self.raw.get_model_repository_index(**self._control, client_timeout=timeout_s)
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
        await self.raw.load_model(model, **self._control, client_timeout=timeout_s)

    async def unload(self, model: str, timeout_s: float) -> None:
        await self.raw.unload_model(model, **self._control, client_timeout=timeout_s)


def _output(response: service_pb2.ModelInferResponse) -> np.ndarray | None:
    """The response's one FP32 output as an array of its shape, or None when it has another form."""
    if len(response.outputs) != 1 or len(response.raw_output_contents) != 1 or response.outputs[0].datatype != "FP32":
        return None
    data, shape = response.raw_output_contents[0], tuple(response.outputs[0].shape)
    if len(data) != 4 * math.prod(shape):
        return None
    return np.frombuffer(data, dtype=np.float32).reshape(shape)
