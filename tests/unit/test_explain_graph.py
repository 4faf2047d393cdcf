"""The explain graph: its ONNX export equals PyTorch (probabilities vs per-candidate windows,
attention vs each window's knowledge-retriever layer, head weights), attention rows sum to at most 1
per head, and nothing after a candidate's position changes its explanation (causality)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from export.explain_export import check_explain_parity, explainable, export_explain_onnx
from export.onnx_export import PARITY_TOL, rank_inputs
from routerkt.contract import signature
from training.models.explain_forward import explain_rank
from tests.unit.test_rank_graph import NQ, NS, WINDOW
from tests.unit.test_rank_graph import _model as tiny_model

pytestmark = pytest.mark.unit


def _model(name: str, seed: int = 0):
    """test_rank_graph's tiny model with two blocks (a retriever layer before the explained one)."""
    return tiny_model(name, seed=seed, n_blocks=2)


@pytest.mark.parametrize("name", ["routerkt-akt", "akt"])
def test_the_onnx_explain_graph_equals_pytorch(name, tmp_path) -> None:
    model = _model(name)
    path = tmp_path / signature.EXPLAIN_ONNX_FILE
    export_explain_onnx(model, path)
    report = check_explain_parity(model, path)
    assert report.max_abs_diff <= PARITY_TOL, report.cases


@pytest.mark.parametrize("name", ["routerkt-akt", "akt", "simplekt", "routerkt-cl4kt"])
def test_weights_sum_to_at_most_one_and_routing_weights(name) -> None:
    model = _model(name)
    arrays = [torch.from_numpy(a) for a in rank_inputs(NQ, NS, 3, WINDOW - 1, 5, seed=4)]
    with torch.no_grad():
        out = explain_rank(model, *arrays)
        logits = model.rank(*arrays)
    torch.testing.assert_close(out.logits, logits, atol=1e-6, rtol=0)
    assert out.attention.shape == (3, 5, 4, WINDOW - 1) and out.head_weights.shape == (3, 5, 4)
    assert (out.attention >= 0).all() and (out.attention.sum(-1) <= 1 + 1e-5).all()
    padding = arrays[0] == signature.PAD_ID                                   # [B, H]
    assert (out.attention.permute(0, 3, 1, 2)[padding] == 0).all()           # no weight on padding
    if name.startswith("routerkt"):
        shared = model.config.n_shared
        assert (out.head_weights[..., :shared] == 1).all()
        assert ((out.head_weights[..., shared:] >= 0) & (out.head_weights[..., shared:] <= 1)).all()
    else:
        assert (out.head_weights == 1).all()


def test_nothing_after_the_candidate_changes_its_explanation() -> None:
    """Changing other candidates (which come after a candidate in the rank layout) or the
    candidate's own response slot leaves its explanation unchanged; changing the history does not."""
    model = _model("routerkt-akt")
    hq, hs, hr, cq, cs = (torch.from_numpy(a) for a in rank_inputs(NQ, NS, 2, WINDOW - 1, 4, seed=7))
    with torch.no_grad():
        base = explain_rank(model, hq, hs, hr, cq, cs)
        cq2, cs2 = cq.clone(), cs.clone()
        cq2[:, 1:] = (cq2[:, 1:] + 5) % (NQ - 2) + 2
        cs2[:, 1:, 0] = (cs2[:, 1:, 0] + 3) % (NS - 2) + 2
        other = explain_rank(model, hq, hs, hr, cq2, cs2)
        alone = explain_rank(model, hq, hs, hr, cq[:, :1], cs[:, :1])
        hr2 = hr.clone()
        hr2[:, -1] = 1 - hr2[:, -1].clamp(min=0)
        changed = explain_rank(model, hq, hs, hr2, cq, cs)
    for out in (other, alone):
        torch.testing.assert_close(out.attention[:, 0], base.attention[:, 0], atol=1e-6, rtol=0)
        torch.testing.assert_close(out.head_weights[:, 0], base.head_weights[:, 0], atol=1e-6, rtol=0)
    assert not torch.allclose(changed.attention[0, 0], base.attention[0, 0], atol=1e-6)


def test_dkt_has_nothing_to_explain() -> None:
    assert not explainable(_model("dkt")) and explainable(_model("akt"))
