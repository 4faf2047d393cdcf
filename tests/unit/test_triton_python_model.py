"""The Triton Python-backend model (export/triton_python_model/model.py) without Triton.

model.py cannot import the project, so its tensor names are literals: they must equal
routerkt/contract/signature.py. Its request handling is exercised against a fake `triton_python_backend_utils`
and a tiny ONNX graph built with onnx.helper.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from export import triton_config
from routerkt.contract import signature
from export.triton_python_model import HELD_STATES_PY, MODEL_PY, PYTHON_MODEL_FILES, VERSION_SETUP_PY

pytestmark = pytest.mark.unit

N_Q, N_S, WINDOW = 20, 6, 5


def _literals() -> dict[str, object]:
    """The module-level literals of model.py and routerkt_version_setup.py (no name in both)."""
    found = {}
    for node in ast.parse(MODEL_PY.read_text()).body + ast.parse(VERSION_SETUP_PY.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            assert node.targets[0].id not in found, node.targets[0].id
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return found


def test_tensor_and_parameter_literals_match_the_signature() -> None:
    lit = _literals()
    assert (lit["QUESTIONS"], lit["SKILLS"], lit["RESPONSES"]) == signature.SCORE.input_names
    assert lit["PROBS"] == signature.PROBS
    assert lit["ONNX_FILE"] == signature.ONNX_FILE
    assert lit["PARAM_ORT_INTRA_OP_THREADS"] == triton_config.PARAM_ORT_INTRA_OP_THREADS
    assert lit["PARAM_ORT_MEM_ARENA"] == triton_config.PARAM_ORT_MEM_ARENA
    assert lit["PARAM_WINDOW"] == triton_config.PARAM_WINDOW
    from serving.metrics import TRITON_METRICS
    assert lit["EXEC_METRIC"] in TRITON_METRICS
    assert lit["INFO_FILE"] == signature.INFO_FILE
    assert lit["PARAM_HELD_STATE_BYTES"] == triton_config.PARAM_HELD_STATE_BYTES
    from routerkt.contract import step_signature
    assert (lit["STATE_REF"], lit["KEEP_AS"]) == (step_signature.STATE_REF.name, step_signature.KEEP_AS.name)
    assert lit["STATE_NOT_HELD"] == step_signature.STATE_NOT_HELD and lit["UPDATED"] == step_signature.UPDATED
    assert lit["STATE_LENGTH"] == step_signature.STATE_LENGTH.name
    held = {n.targets[0].id: n.value.value for n in ast.parse(HELD_STATES_PY.read_text()).body
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)}
    assert held["STATE_LENGTH"] == step_signature.STATE_LENGTH.name
    from routerkt.contract.model_info import ModelInfo
    assert dict(lit["INFO_BOUNDS"]) == {"n_questions": triton_config.PARAM_N_QUESTIONS,
                                        "n_skills": triton_config.PARAM_N_SKILLS}
    assert set(dict(lit["INFO_BOUNDS"])) <= set(ModelInfo.__dataclass_fields__)


def test_model_py_imports_nothing_from_the_project() -> None:
    tree = ast.parse(MODEL_PY.read_text())
    modules = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
               for alias in node.names}
    modules |= {node.module.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module}
    assert modules <= {"json", "os", "time", "numpy", "onnxruntime", "triton_python_backend_utils",
                       "routerkt_held_states", "routerkt_version_setup"}
    for path, allowed in ((HELD_STATES_PY, {"collections", "OrderedDict", "numpy"}),
                          (VERSION_SETUP_PY, {"json", "os", "onnxruntime"})):
        tree = ast.parse(path.read_text())
        assert {alias.name for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in node.names} | {node.module for node in ast.walk(tree)
                                            if isinstance(node, ast.ImportFrom)} <= allowed, path.name
    assert {name[:-3] for name in PYTHON_MODEL_FILES} >= modules - {"json", "os", "time", "numpy", "onnxruntime",
                                                                    "triton_python_backend_utils"}


# -- a fake triton_python_backend_utils -----------------------------------------------------------
class _TritonError(Exception):
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class _Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class _Response:
    def __init__(self, output_tensors=(), error=None) -> None:
        self.output_tensors, self.error = list(output_tensors), error


class _Request:
    def __init__(self, arrays: dict[str, np.ndarray], cancelled: bool = False) -> None:
        self.arrays, self.cancelled = arrays, cancelled

    def is_cancelled(self) -> bool:
        return self.cancelled


class _Histogram:
    def __init__(self) -> None:
        self.observed: list[float] = []

    def observe(self, value: float) -> None:
        self.observed.append(value)

    def set(self, value: float) -> None:              # a gauge's
        self.value = value


class _MetricFamily:
    COUNTER, GAUGE, HISTOGRAM = range(3)
    created: list["_MetricFamily"] = []

    def __init__(self, name: str, description: str, kind: int) -> None:
        self.name, self.kind, self.metrics = name, kind, []
        _MetricFamily.created.append(self)

    def Metric(self, labels: dict, buckets: list | None = None) -> _Histogram:  # noqa: N802 - Triton's name
        self.metrics.append((labels, buckets))
        return _Histogram()


def _fake_pb_utils() -> types.ModuleType:
    module = types.ModuleType("triton_python_backend_utils")
    module.TritonError = _TritonError
    module.TritonModelException = RuntimeError
    module.Tensor = _Tensor
    module.InferenceResponse = _Response
    module.MetricFamily = _MetricFamily
    module.get_input_tensor_by_name = lambda request, name: (
        _Tensor(name, request.arrays[name]) if name in request.arrays else None)
    return module


def _tiny_onnx(path: Path) -> None:
    """probs = sigmoid(0.01*q + 0.1*sum(s over the set) + r): q, r int64 [B, L], s [B, L, K] -> float32 [B, L]."""
    import onnx
    from onnx import TensorProto, helper

    inputs = [helper.make_tensor_value_info(t.name, TensorProto.INT64, list(t.axes)) for t in signature.SCORE.inputs]
    output = helper.make_tensor_value_info(signature.PROBS, TensorProto.FLOAT, ["batch", "seq"])
    consts = [helper.make_tensor(f"w_{n}", TensorProto.FLOAT, [], [w])
              for n, w in zip(signature.SCORE.input_names, (0.01, 0.1, 1.0))]
    consts.append(helper.make_tensor("last_axis", TensorProto.INT64, [1], [-1]))
    nodes = []
    for n in signature.SCORE.input_names:
        nodes.append(helper.make_node("Cast", [n], [f"f_{n}"], to=TensorProto.FLOAT))
        if n == "skills":
            nodes.append(helper.make_node("ReduceSum", ["f_skills", "last_axis"], ["sum_skills"], keepdims=0))
            nodes.append(helper.make_node("Mul", ["sum_skills", f"w_{n}"], [f"m_{n}"]))
            continue
        nodes.append(helper.make_node("Mul", [f"f_{n}", f"w_{n}"], [f"m_{n}"]))
    nodes.append(helper.make_node("Sum", [f"m_{n}" for n in signature.SCORE.input_names], ["z"]))
    nodes.append(helper.make_node("Sigmoid", ["z"], [signature.PROBS]))
    graph = helper.make_graph(nodes, "tiny", inputs, [output], initializer=consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10                          # readable by onnxruntime 1.31 (max IR 13)
    onnx.save(model, str(path))


def _expected(questions: np.ndarray, skills: np.ndarray, responses: np.ndarray) -> np.ndarray:
    return (1 / (1 + np.exp(-(0.01 * questions + 0.1 * skills.sum(-1) + responses)))).astype(np.float32)


def _initialized(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parameters: dict[str, str],
                 info: bytes | None = None):
    """model.py's TritonPythonModel initialized on version 1 of `tmp_path` (the tiny score graph), with
    config parameters `parameters` and, when given, `info` as the version's model_info.json."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", _fake_pb_utils())
    monkeypatch.syspath_prepend(str(MODEL_PY.parent))       # the stub puts the version folder on sys.path
    spec = importlib.util.spec_from_file_location("routerkt_test_backend_model", MODEL_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "1").mkdir(exist_ok=True)
    _tiny_onnx(tmp_path / "1" / signature.ONNX_FILE)
    if info is not None:
        (tmp_path / "1" / signature.INFO_FILE).write_bytes(info)
    config = triton_config.build_config("tiny", triton_config.TritonModelOptions(window=WINDOW, parameters=parameters))
    from google.protobuf import json_format
    instance = module.TritonPythonModel()
    instance.initialize({"model_config": json.dumps(json_format.MessageToDict(config, preserving_proto_field_name=True)),
                         "model_repository": str(tmp_path), "model_version": "1", "model_name": "tiny"})
    return instance


@pytest.fixture()
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    instance = _initialized(tmp_path, monkeypatch, {
        triton_config.PARAM_N_QUESTIONS: str(N_Q), triton_config.PARAM_N_SKILLS: str(N_S)})
    yield instance
    instance.finalize()


def _info(n_questions: int, n_skills: int) -> bytes:
    from routerkt.contract.model_info import ModelInfo
    return ModelInfo(name="tiny", window=WINDOW, n_questions=n_questions, n_skills=n_skills).save_bytes()


def test_id_bounds_come_from_the_versions_model_info_before_the_config(tmp_path, monkeypatch) -> None:
    """What export writes: model_info.json with the bounds, a config without them (the same config
    for every vocabulary); config parameters, when a served config still has them, do not override."""
    grown = _initialized(tmp_path, monkeypatch, {}, _info(N_Q + 10, N_S + 2))
    assert (grown.n_questions, grown.n_skills) == (N_Q + 10, N_S + 2)
    ok = _arrays(1, 1, questions=np.full((1, WINDOW), N_Q + 9), skills=np.full((1, WINDOW, 1), N_S + 1))
    too_big = _arrays(1, 2, questions=np.full((1, WINDOW), N_Q + 10))
    responses = grown.execute([_Request(ok), _Request(too_big)])
    assert responses[0].error is None
    assert responses[1].error.code() == _TritonError.INVALID_ARG and f"[0, {N_Q + 10})" in responses[1].error.message()
    legacy_params = {triton_config.PARAM_N_QUESTIONS: str(N_Q), triton_config.PARAM_N_SKILLS: str(N_S)}
    kept = _initialized(tmp_path, monkeypatch, legacy_params, _info(N_Q + 10, N_S + 2))
    assert (kept.n_questions, kept.n_skills) == (N_Q + 10, N_S + 2)


@pytest.mark.parametrize("info", [None, b'{"preset": "tiny"}', b"not json", _info(0, 0)],
                         ids=["no-file", "no-fields", "malformed", "zeros"])
def test_a_version_without_bounds_in_model_info_falls_back_to_the_config(tmp_path, monkeypatch, info) -> None:
    params = {triton_config.PARAM_N_QUESTIONS: str(N_Q), triton_config.PARAM_N_SKILLS: str(N_S)}
    instance = _initialized(tmp_path, monkeypatch, params, info)
    assert (instance.n_questions, instance.n_skills) == (N_Q, N_S)
    with pytest.raises(RuntimeError, match="n_questions"):              # neither source: the load fails, named
        _initialized(tmp_path, monkeypatch, {}, info)


def _arrays(rows: int, seed: int, k: int = 1, **overrides) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = {"questions": rng.integers(0, N_Q, (rows, WINDOW)), "skills": rng.integers(0, N_S, (rows, WINDOW, k)),
              "responses": rng.integers(-1, 2, (rows, WINDOW))}
    arrays.update(overrides)
    return {k: np.asarray(v, dtype=np.int64) for k, v in arrays.items()}


def test_execute_splits_one_run_per_request_and_isolates_bad_requests(model) -> None:
    good_a, good_b = _arrays(2, 1), _arrays(1, 2, k=3)          # skill sets of 1 and 3 slots: padded together
    bad_q = _arrays(1, 3, questions=np.full((1, WINDOW), N_Q))
    bad_s = _arrays(1, 4, skills=np.full((1, WINDOW, 1), -1))
    bad_r = _arrays(1, 5, responses=np.full((1, WINDOW), 2))
    bad_shape = {**_arrays(1, 6), "skills": np.zeros((2, WINDOW, 1), dtype=np.int64)}
    requests = [_Request(good_a), _Request(bad_q), _Request(good_b), _Request(_arrays(1, 7), cancelled=True),
                _Request(bad_s), _Request(bad_r), _Request(bad_shape)]
    responses = model.execute(requests)
    assert len(responses) == len(requests)
    for index, arrays in ((0, good_a), (2, good_b)):
        assert responses[index].error is None
        (tensor,) = responses[index].output_tensors
        assert tensor.name() == signature.PROBS
        np.testing.assert_allclose(tensor.as_numpy(), _expected(**arrays), atol=1e-6)
    expected_errors = {1: "'questions'", 4: "'skills'", 5: "'responses'", 6: "'skills'"}
    for index, name in expected_errors.items():
        error = responses[index].error
        assert error.code() == _TritonError.INVALID_ARG and name in error.message()
    assert responses[3].error.code() == _TritonError.CANCELLED
    assert len(model.exec_seconds.observed) == 1          # one ORT run for the whole batch


def test_all_bad_batch_never_runs_the_model(model) -> None:
    responses = model.execute([_Request(_arrays(1, 1, questions=np.full((1, WINDOW), 10_000)))])
    assert responses[0].error.code() == _TritonError.INVALID_ARG
    assert model.exec_seconds.observed == []


def test_ort_failure_answers_each_good_request_with_a_generic_error(model, monkeypatch) -> None:
    class Broken:
        def run(self, *args, **kwargs):
            raise RuntimeError("[ONNXRuntimeError] at /secret/path/model.onnx: boom")

    monkeypatch.setattr(model, "session", Broken())
    responses = model.execute([_Request(_arrays(1, 1)), _Request(_arrays(2, 2))])
    for response in responses:
        assert response.error.code() == _TritonError.INTERNAL
        assert response.error.message() == "model execution failed"


def test_histogram_metric_is_registered_with_model_labels(model) -> None:
    family = model.exec_family
    assert family.name == "routerkt_triton_model_exec_seconds" and family.kind == _MetricFamily.HISTOGRAM
    labels, buckets = family.metrics[0]
    assert labels == {"model": "tiny", "version": "1"}
    assert buckets == sorted(buckets) and buckets[0] < 0.001
