"""The exported rank graph: onnxruntime parity with PyTorch per-candidate windows for one preset per
attention kind (and DKT), the published rank.onnx next to model.onnx, and the refusal to publish
when rank parity fails."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from export.onnx_export import (PARITY_TOL, candidate_windows, check_rank_parity, example_inputs, export_onnx,
                                export_rank_onnx, rank_batches, rank_inputs)
from routerkt.contract import signature
from routerkt.contract.onnx_session import cpu_session
from tests.integration.export_helpers import assert_a_failed_parity_publishes_nothing
from tests.tiny_models import random_tiny_model
from training.models.registry import build_model, preset_config, with_vocab

pytestmark = pytest.mark.integration
NQ, NS, WINDOW = 60, 14, 12

# monotonic (AKT), alibi (CL4KT), relative (AKT), standard + prefix routing + positions (SimpleKT), LSTM
REPRESENTATIVE = ["akt", "alibi-cl4kt", "relative-akt", "routerkt-simplekt", "dkt"]


def _tiny(name: str):
    return random_tiny_model(name, NQ, NS, WINDOW)


@pytest.mark.parametrize("name", REPRESENTATIVE)
def test_rank_graph_parity(name, tmp_path):
    model = _tiny(name)
    path = tmp_path / signature.RANK_ONNX_FILE
    export_rank_onnx(model, path)
    graph = onnx.load(str(path)).graph
    assert [i.name for i in graph.input] == list(signature.RANK.input_names)
    assert [o.name for o in graph.output] == list(signature.RANK.output_names)
    real_like = rank_batches([example_inputs(NQ, NS, 9, WINDOW, seed=7, min_len=1)], candidates=5)
    report = check_rank_parity(model, path, batches=real_like,
                               shapes=((1, WINDOW - 1, 1), (6, WINDOW - 1, 64), (3, 4, 3), (2, 1, 2)))
    assert report.ok and report.max_abs_diff <= PARITY_TOL, report.cases
    assert [c[:3] for c in report.cases] == [(1, 11, 1), (6, 11, 64), (3, 4, 3), (2, 1, 2), (9, 11, 5)]


def test_an_lstm_keeps_its_dynamic_history_when_exported_after_another_graph(tmp_path):
    """PyTorch 2.13 specialized a DKT rank graph exported after its score graph (the exporter's
    order) to the example's 15 history steps; serving sends window - 1."""
    torch.manual_seed(0)
    cfg = with_vocab(preset_config("dkt"), NQ, NS)
    cfg.lstm_hidden, cfg.max_len = 16, 40
    model = build_model(cfg).eval()
    export_onnx(model, tmp_path / signature.ONNX_FILE)                    # first export in the test
    path = tmp_path / signature.RANK_ONNX_FILE
    export_rank_onnx(model, path)
    history = onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim[1]
    assert history.dim_param, f"history axis fixed to {history.dim_value}"
    report = check_rank_parity(model, path, batches=[], shapes=((2, 39, 3), (1, 5, 2)))
    assert report.ok and report.max_abs_diff <= PARITY_TOL, report.cases


def test_published_rank_graph_matches_the_score_graph(kt_repository):
    """From the published files alone: rank.onnx == model.onnx's last probability per window."""
    version = kt_repository.path / kt_repository.name / "1"
    assert (version / signature.RANK_ONNX_FILE).is_file() and (version / signature.ONNX_FILE).is_file()
    info = json.loads((version / signature.INFO_FILE).read_text())
    assert info["graphs"]["rank"]["outputs"] == [signature.CANDIDATE_PROBS]
    window = info["window"]
    arrays = rank_inputs(info["n_questions"], info["n_skills"], 5, window - 1, 16, seed=3)
    rank = cpu_session(version / signature.RANK_ONNX_FILE)
    got = rank.run([signature.CANDIDATE_PROBS], dict(zip(signature.RANK.input_names, arrays)))[0]
    q, s, r = candidate_windows(*arrays)
    score = cpu_session(version / signature.ONNX_FILE)
    ref = score.run([signature.PROBS], {"questions": q, "skills": s, "responses": r})[0][:, -1].reshape(got.shape)
    valid = (arrays[4] != signature.PAD_ID).any(axis=-1)              # candidates with a skill set
    assert np.abs(got - ref)[valid].max() <= PARITY_TOL


def test_failed_rank_parity_publishes_nothing(kt_repository, tmp_path, monkeypatch):
    assert_a_failed_parity_publishes_nothing(kt_repository.run, tmp_path / "repo", monkeypatch, "rank")
