"""export/attention_fusion.py: every attention core that is softmax(Q K^T * c + bias) V becomes one
com.microsoft.MultiHeadAttention node, in the score and the rank graph, with the same outputs
(the export's parity checks); monotonic (AKT decay) cores stay plain operators and are reported;
a graph without attention is left as it is; a wrong fused scale fails the parity check."""
from __future__ import annotations

import collections

import onnx
import pytest
from onnx import helper

from export.attention_fusion import MS_DOMAIN, RANK_LAYOUT, fuse_attention_file
from export.onnx_export import PARITY_TOL, check_parity, check_rank_parity, export_onnx, export_rank_onnx
from training.config import AttentionKind
from training.models.attention import MultiHeadAttention
from tests.unit.test_rank_graph import _model

pytestmark = pytest.mark.unit
# every attention kind (folibi-akt: monotonic encoders, which stay plain, beside an ALiBi retriever)
# and the CL4KT backbone; each case exports two graphs, so the list is kept short
PRESETS = ["akt-standard", "routerkt-akt", "alibi-akt", "relative-akt", "folibi-akt", "routerkt-cl4kt"]


def _ops(path) -> collections.Counter:
    return collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node)


@pytest.mark.parametrize("preset", PRESETS)
def test_each_attention_core_is_fused_or_reported_and_outputs_stay(preset, tmp_path):
    model = _model(preset, max_len=24)          # > 16: the export keeps the history axis dynamic
    layers = {n: m for n, m in model.named_modules() if isinstance(m, MultiHeadAttention)}
    monotonic = {n for n, m in layers.items() if m.kind is AttentionKind.MONOTONIC}
    # the rank graph: value encoders run in the window layout over the history; the other cores
    # score history keys plus each query's own slot, which stays plain
    window_in_rank = {n for n in layers if n.startswith(("knowledge_encoder", "interaction_encoder"))}
    for export, parity, name in ((export_onnx, check_parity, "score"), (export_rank_onnx, check_rank_parity, "rank")):
        plain, fused = tmp_path / f"{name}.onnx", tmp_path / f"{name}.fused.onnx"
        export(model, plain)
        report = fuse_attention_file(plain, fused)
        window = set(layers) if name == "score" else window_in_rank
        assert report.fused == len(window - monotonic), report.describe()
        assert sorted(report.plain) == sorted(["scores are not Q K^T + bias (monotonic decay)"] * len(window & monotonic)
                                              + [RANK_LAYOUT] * len(set(layers) - window)), report.describe()
        ops = _ops(fused)
        assert ops["MultiHeadAttention"] == report.fused
        assert ops["Softmax"] == _ops(plain)["Softmax"] - report.fused      # router / decay softmaxes stay
        result = parity(model, fused)
        assert result.max_abs_diff <= PARITY_TOL, (name, result.max_abs_diff)


def test_a_graph_without_attention_is_unchanged(tmp_path):
    model = _model("dkt")
    export_onnx(model, tmp_path / "m.onnx")
    report = fuse_attention_file(tmp_path / "m.onnx", tmp_path / "f.onnx")
    assert report.fused == 0 and report.plain == []
    assert onnx.load(str(tmp_path / "m.onnx")).graph == onnx.load(str(tmp_path / "f.onnx")).graph


def test_a_wrong_fused_scale_fails_parity(tmp_path):
    model = _model("akt-standard")
    export_onnx(model, tmp_path / "m.onnx")
    fuse_attention_file(tmp_path / "m.onnx", tmp_path / "f.onnx")
    graph = onnx.load(str(tmp_path / "f.onnx"))
    node = next(n for n in graph.graph.node if n.op_type == "MultiHeadAttention" and n.domain == MS_DOMAIN)
    scale = next(a for a in node.attribute if a.name == "scale")
    node.attribute.remove(scale)
    node.attribute.append(helper.make_attribute("scale", scale.f * 3.0))
    onnx.save(graph, str(tmp_path / "wrong.onnx"))
    assert check_parity(model, tmp_path / "wrong.onnx").max_abs_diff > PARITY_TOL
