"""The step graphs' contract (routerkt/contract/step_signature.py) is consistent: what step_start gives is what
step_append and step_next take, step_append gives it back under `updated_` names, history and candidates are the
rank graph's tensors; the state's bytes per learner; model_info.json records step graphs only when there are."""
import json
import math

import pytest

from routerkt.contract import signature
from routerkt.contract.model_info import ModelInfo, ModelInfoError
from routerkt.contract.step_signature import (ATTENTION, RECURRENT, STEP_FILES, STEP_GRAPHS, UPDATED, state_kind_of)

pytestmark = pytest.mark.unit
DTYPES = {"int64": ("TYPE_INT64", "INT64"), "float32": ("TYPE_FP32", "FP32")}


@pytest.mark.parametrize("kind", [ATTENTION, RECURRENT])
def test_the_state_flows_from_start_through_append_to_next(kind):
    graphs = STEP_GRAPHS[kind]
    assert graphs.state_kind == kind and [g.name for g in graphs.graphs] == list(STEP_FILES)
    assert graphs.start.inputs == signature.RANK.inputs[:3] and graphs.start.outputs == graphs.state
    assert graphs.append.inputs[:len(graphs.state)] == graphs.state
    assert [t.name for t in graphs.append.inputs[len(graphs.state):]] == ["append_question", "append_skills",
                                                                           "append_response"]
    assert [t.name for t in graphs.append.outputs] == [UPDATED + t.name for t in graphs.state]
    assert [(t.dtype, t.axes) for t in graphs.append.outputs] == [(t.dtype, t.axes) for t in graphs.state]
    assert graphs.next.inputs == graphs.state + signature.RANK.inputs[3:]
    assert graphs.next.outputs == signature.RANK.outputs
    for graph in graphs.graphs:
        names = graph.input_names + graph.output_names
        assert len(set(names)) == len(names), graph.name
        for spec in graph.inputs + graph.outputs:
            assert (spec.triton_dtype, spec.onnx_dtype) == DTYPES[spec.dtype] and spec.axes[0] == "batch"
            ids = spec.name.endswith(("question", "questions", "skills", "response", "responses", "length"))
            assert spec.dtype == ("int64" if ids else "float32"), spec.name
            assert signature.skill_axis(spec) == spec.name.endswith("skills")


def test_state_layouts_and_files():
    attention = {t.name: t.axes for t in STEP_GRAPHS[ATTENTION].state}
    assert attention == {"state_length": ("batch",),
                         "state_keys": ("batch", "layers", "heads", "history", "head_dim"),
                         "state_values": ("batch", "layers", "heads", "history", "head_dim"),
                         "state_sums": ("batch", "sums")}
    assert [t.name for t in STEP_GRAPHS[RECURRENT].state] == ["state_length", "state_hidden", "state_cell"]
    assert set(STEP_FILES.values()) == {"step_start.onnx", "step_append.onnx", "step_next.onnx"}
    assert not set(STEP_FILES.values()) & {signature.ONNX_FILE, signature.RANK_ONNX_FILE, signature.EXPLAIN_ONNX_FILE}
    assert not set(STEP_FILES) & set(signature.GRAPHS)           # not served by Triton's configs


def test_model_info_records_step_graphs_only_when_exported():
    plain = ModelInfo(name="kt", window=100)
    assert "step_graphs" not in plain.to_json() and plain.step_state is None
    names = {g.name: {"inputs": list(g.input_names), "outputs": list(g.output_names)}
             for g in STEP_GRAPHS[RECURRENT].graphs}
    assert state_kind_of(names) == RECURRENT
    stepped = ModelInfo(name="kt", window=100, step_graphs=names, step_parity_max_abs_diff=2e-7)
    again = ModelInfo.from_json(json.loads(stepped.save_bytes()))
    assert again.step_state == RECURRENT and again.step_parity_max_abs_diff == 2e-7
    old = plain.to_json()                                       # a file written before step graphs existed
    assert ModelInfo.from_json(old).step_graphs == {} and math.isnan(ModelInfo.from_json(old).step_parity_max_abs_diff)
    names["step_next"]["outputs"] = ["probs"]
    with pytest.raises(ModelInfoError, match="step_graphs"):
        ModelInfo.from_json({**old, "step_graphs": names}, "model_info.json")
