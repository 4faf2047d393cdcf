"""How an exported ONNX graph is run on a CPU, as served: graph optimisation ALL, one inter-op
thread, no CPU memory arena (it would keep every session's peak, ~2 GB at batch 512), and intra-op
threads that do not spin-wait after a run (with spinning, each run left a thread busy for ~40 ms
at full CPU, competing with the gateway and Triton on this 2-core machine: issue 18's profile). The parity
check at export, the benchmarks and the gateway's in-process backend all open sessions here; the
Triton python-backend model (export/triton_python_model/model.py) mirrors these settings, since it
may import nothing of the project. onnxruntime is imported on first use."""
from __future__ import annotations

import os


def cpu_session(path: str | os.PathLike, threads: int = 0, mem_arena: bool = False):
    """An onnxruntime InferenceSession on the CPU; `threads` 0 = onnxruntime's default."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.enable_cpu_mem_arena = mem_arena
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
