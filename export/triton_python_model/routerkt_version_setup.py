"""What a python-backend model instance reads as it starts: its version folder's model_info.json and id bounds,
its onnxruntime sessions (checked against the signature's names) and its execution-time histogram.

Copied beside model.py by `routerkt export`; imports only the standard library and onnxruntime, and takes
`triton_python_backend_utils` as an argument (so it never holds on to one stub's module). The literals mirror
routerkt/contract/signature.py and export/triton_config.py (tests/unit/test_triton_python_model.py keeps them equal).
"""
import json
import os

import onnxruntime as ort

PARAM_ORT_INTRA_OP_THREADS = "ORT_INTRA_OP_THREADS"
PARAM_ORT_MEM_ARENA = "ORT_CPU_MEM_ARENA"
INFO_FILE = "model_info.json"
INFO_BOUNDS = (("n_questions", "N_QUESTIONS"), ("n_skills", "N_SKILLS"))   # (field, fallback parameter)
EXEC_METRIC = "routerkt_triton_model_exec_seconds"
EXEC_BUCKETS = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0]


def session_options(params):
    """onnxruntime options from the config parameters: as routerkt/contract/onnx_session.py, no spinning."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = int(params.get(PARAM_ORT_INTRA_OP_THREADS, "1") or "1")
    options.enable_cpu_mem_arena = params.get(PARAM_ORT_MEM_ARENA, "0") == "1"
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def checked_session(pb_utils, path, options, input_names, output_names):
    """An onnxruntime session of `path`, checked against the signature's input and output names."""
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    missing = set(output_names) - {o.name for o in session.get_outputs()}
    if names != set(input_names) or missing:
        raise pb_utils.TritonModelException(
            f"{os.path.basename(path)} does not match the signature: inputs {sorted(names)}, "
            f"expected {sorted(input_names)} and outputs {list(output_names)}")
    return session


def version_info(folder):
    """The version folder's model_info.json as a dict ({} when missing or unreadable)."""
    try:
        with open(os.path.join(folder, INFO_FILE), encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError):
        info = None
    return info if isinstance(info, dict) else {}


def id_bounds(pb_utils, folder, params):
    """(n_questions, n_skills): valid ids are [0, n). From the version folder's model_info.json, so a
    version with a grown vocabulary needs no other config.pbtxt; for a version whose model_info.json
    lacks them (or has none), from the config parameters N_QUESTIONS / N_SKILLS."""
    info = version_info(folder)
    bounds = []
    for field, key in INFO_BOUNDS:
        value = info.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            bounds.append(value)
            continue
        text = params.get(key, "")
        if not text.isdigit() or int(text) < 1:
            raise pb_utils.TritonModelException(
                f"no id bound {field}: {INFO_FILE} of version {os.path.basename(folder)} has no positive "
                f"'{field}' and config.pbtxt parameter {key} is {text!r}")
        bounds.append(int(text))
    return tuple(bounds)


def exec_histogram(pb_utils, model_name, version):
    """(family, histogram) of ORT run time per execution; (None, None) without the histogram API."""
    family_cls = getattr(pb_utils, "MetricFamily", None)
    if family_cls is None or not hasattr(family_cls, "HISTOGRAM"):
        return None, None
    try:
        family = family_cls(
            name=EXEC_METRIC,
            description="onnxruntime execution time of one (dynamic) batch in the python backend",
            kind=family_cls.HISTOGRAM)
        metric = family.Metric(labels={"model": model_name, "version": str(version)}, buckets=EXEC_BUCKETS)
        return family, metric
    except Exception:                              # metrics disabled or API mismatch: serve anyway
        return None, None
