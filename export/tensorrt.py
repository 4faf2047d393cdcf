"""TensorRT engines (`model.plan`) for GPU hosts, built from the exported ONNX model.

TensorRT cannot be installed on the CPU development machines (the PyPI packages are stubs that
download from NVIDIA's own index, and nothing runs without a CUDA driver; docs/training.md), so
this module only works on a GPU host with TensorRT 10.x (8.x and 11.x are handled where they differ).
A plan is a build output for one GPU model and one TensorRT version: never commit or copy one.

- `tensorrt_available()` says whether a build can run here, and why not.
- `build_engine(...)` builds and atomically writes a plan with one optimisation profile covering
  batch sizes [min_batch, max_batch] at the fixed window, for every input of routerkt/contract/signature.py.
- `trtexec_command(...)` prints the equivalent `trtexec` command line (for the docs).
"""
from __future__ import annotations

import ctypes
import shlex
from pathlib import Path

from routerkt.contract import signature
from routerkt.atomic import atomic_write_bytes
from routerkt.errors import UserError

DEFAULT_WORKSPACE_BYTES = 1 << 30


def tensorrt_available() -> tuple[bool, str]:
    """(True, "TensorRT <version>, <n> CUDA device(s)") or (False, one-line reason)."""
    try:
        import tensorrt as trt  # noqa: PLC0415 - optional, GPU hosts only
    except Exception as exc:  # ImportError, or a broken install raising OSError at import
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return False, f"TensorRT is not installed in this environment ({detail})"
    devices, reason = _cuda_device_count()
    if devices < 1:
        return False, f"TensorRT {trt.__version__} is installed but no CUDA device is usable ({reason})"
    return True, f"TensorRT {trt.__version__}, {devices} CUDA device(s)"


def build_engine(onnx_path: Path, plan_path: Path, window: int, min_batch: int = 1,
                 opt_batch: int = 32, max_batch: int = 1024, fp16: bool = False,
                 workspace_bytes: int = DEFAULT_WORKSPACE_BYTES) -> Path:
    """Build a TensorRT plan from `onnx_path` and write it atomically to `plan_path`.

    The profile covers inputs [batch, window] (int64) with batch in [min_batch, max_batch],
    tuned for opt_batch. fp16 uses the weakly typed FP16 builder flag (TensorRT <= 10.x; 11.x
    removed it: convert the ONNX model to mixed precision first). Raises UserError when TensorRT
    is unavailable, the shapes are inconsistent, or the ONNX model does not parse/build."""
    onnx_path, plan_path = Path(onnx_path), Path(plan_path)
    _check_shapes(window, min_batch, opt_batch, max_batch)
    ok, reason = tensorrt_available()
    if not ok:
        raise UserError(f"cannot build a TensorRT engine: {reason}")
    if not onnx_path.is_file():
        raise UserError(f"ONNX model not found: {onnx_path}")
    import tensorrt as trt  # noqa: PLC0415

    major = int(trt.__version__.split(".")[0])
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    # TensorRT 10+ networks are always explicit-batch; 8.x still needs the flag.
    flags = 0 if major >= 10 else 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise UserError(f"TensorRT could not parse {onnx_path}: {errors or 'unknown error'}")

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    if fp16:
        if not hasattr(trt.BuilderFlag, "FP16"):
            raise UserError(f"TensorRT {trt.__version__} has no FP16 builder flag (strong typing only): "
                            "convert the ONNX model to mixed precision and build with fp16=False")
        config.set_flag(trt.BuilderFlag.FP16)

    profile = builder.create_optimization_profile()
    names = [network.get_input(i).name for i in range(network.num_inputs)]
    if sorted(names) != sorted(signature.SCORE.input_names):
        raise UserError(f"{onnx_path} inputs {names} do not match the signature {list(signature.SCORE.input_names)}")
    for name in names:
        profile.set_shape(name, (min_batch, window), (opt_batch, window), (max_batch, window))
    config.add_optimization_profile(profile)

    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise UserError(f"TensorRT failed to build an engine from {onnx_path} (see its log above)")
    atomic_write_bytes(plan_path, bytes(memoryview(serialized)))
    return plan_path


def trtexec_command(onnx_path: Path, plan_path: Path, window: int, min_batch: int = 1,
                    opt_batch: int = 32, max_batch: int = 1024, fp16: bool = False,
                    workspace_bytes: int = DEFAULT_WORKSPACE_BYTES) -> str:
    """The `trtexec` command line (TensorRT 10.x) equivalent to `build_engine` with these args."""
    _check_shapes(window, min_batch, opt_batch, max_batch)

    def shapes(batch: int) -> str:
        return ",".join(f"{name}:{batch}x{window}" for name in signature.SCORE.input_names)

    parts = [
        "trtexec",
        shlex.quote(f"--onnx={onnx_path}"),
        shlex.quote(f"--saveEngine={plan_path}"),
        f"--minShapes={shapes(min_batch)}",
        f"--optShapes={shapes(opt_batch)}",
        f"--maxShapes={shapes(max_batch)}",
        f"--memPoolSize=workspace:{max(1, workspace_bytes // (1 << 20))}",   # MiB
    ]
    if fp16:
        parts.append("--fp16")
    return " ".join(parts)


def _check_shapes(window: int, min_batch: int, opt_batch: int, max_batch: int) -> None:
    if window < 1:
        raise UserError(f"window must be >= 1, got {window}")
    if not 1 <= min_batch <= opt_batch <= max_batch:
        raise UserError(f"need 1 <= min_batch <= opt_batch <= max_batch, got {min_batch}, {opt_batch}, {max_batch}")


def _cuda_device_count() -> tuple[int, str]:
    """Number of CUDA devices through the driver API (no torch), and a reason when 0."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0, "no CUDA driver (libcuda.so.1 not found)"
    status = cuda.cuInit(0)
    if status != 0:
        return 0, f"cuInit failed with CUDA error {status}"
    count = ctypes.c_int(0)
    status = cuda.cuDeviceGetCount(ctypes.byref(count))
    if status != 0:
        return 0, f"cuDeviceGetCount failed with CUDA error {status}"
    return count.value, "no CUDA device found" if count.value == 0 else ""


