"""Inference backends (serving/pipeline/parts.py: InferenceBackend): triton/, the production path to one
or several Triton servers (client, supervisor with model_control and gates, backend, replicas);
onnxruntime.py, the same ONNX files in-process, for development and for tests of the code around the
backend (never instead of the e2e tests with a real Triton)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from serving.metrics import Metrics
    from serving.pipeline.parts import InferenceBackend
    from serving.settings import Settings


def _triton(settings: "Settings", metrics: "Metrics") -> "InferenceBackend":
    from serving.backends.triton.replica_set import triton_backend
    return triton_backend(settings, metrics)


def _onnxruntime(settings: "Settings", metrics: "Metrics") -> "InferenceBackend":
    from serving.backends.onnxruntime import OnnxRuntimeBackend
    return OnnxRuntimeBackend(settings)


@dataclass(frozen=True)
class BackendEntry:
    build: Callable[["Settings", "Metrics"], "InferenceBackend"]
    uses_triton: bool          # `routerkt serve` starts (or reaches) a tritonserver for it
    description: str


# The one table of inference backends: settings.backend (`routerkt serve --backend NAME`) picks one for
# create_server; a new backend is one file (or folder) beside these plus its line below.
BACKENDS: dict[str, BackendEntry] = {
    "triton": BackendEntry(_triton, True, "Triton (one server, or several replicas)"),
    "onnxruntime": BackendEntry(_onnxruntime, False, "onnxruntime in this process (development backend, no Triton)"),
}
