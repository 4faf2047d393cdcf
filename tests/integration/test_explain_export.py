"""`routerkt export` and the explain graph: the published version holds explain.onnx beside model.onnx
and rank.onnx, config.pbtxt (python backend, GRAPH rank) also declares the explain outputs, the
explain graph's probabilities equal the rank graph's, and a failed explain parity publishes nothing."""
from __future__ import annotations

import json

import numpy as np
import pytest

from export.onnx_export import PARITY_TOL, rank_inputs
from export.triton_config import PARAM_GRAPH, Backend, TritonModelOptions, render_config
from routerkt.contract import signature
from routerkt.contract.onnx_session import cpu_session
from routerkt.contract.repository_reader import parse_triton_config as parse_config
from routerkt.errors import UserError
from tests.integration.export_helpers import assert_a_failed_parity_publishes_nothing

pytestmark = pytest.mark.integration


def test_the_published_version_serves_the_explain_graph(kt_repository):
    version = kt_repository.path / kt_repository.name / "1"
    assert (version / signature.EXPLAIN_ONNX_FILE).is_file()
    info = json.loads((version / signature.INFO_FILE).read_text())
    assert info["explain_parity_max_abs_diff"] <= PARITY_TOL
    config = parse_config((kt_repository.path / kt_repository.name / signature.CONFIG_FILE).read_text())
    assert config.parameters[PARAM_GRAPH].string_value == signature.RANK.name
    assert tuple(t.name for t in config.input) == signature.RANK.input_names
    assert tuple(t.name for t in config.output) == signature.EXPLAIN.output_names
    assert [list(t.dims) for t in config.output] == [[-1], [-1, -1, info["window"] - 1], [-1, -1]]
    arrays = rank_inputs(info["n_questions"], info["n_skills"], 3, info["window"] - 1, 6, seed=5)
    feeds = dict(zip(signature.RANK.input_names, arrays))
    rank = cpu_session(version / signature.RANK_ONNX_FILE).run([signature.CANDIDATE_PROBS], feeds)[0]
    probs, attention, weights = cpu_session(version / signature.EXPLAIN_ONNX_FILE).run(
        list(signature.EXPLAIN.output_names), feeds)
    valid = arrays[4][..., 0] != signature.PAD_ID
    assert np.abs(probs - rank)[valid].max() <= PARITY_TOL
    assert attention.shape[:2] == weights.shape[:2] == probs.shape and attention.shape[-1] == info["window"] - 1
    assert (attention.sum(-1) <= 1 + 1e-5).all()


def test_failed_explain_parity_publishes_nothing(kt_repository, tmp_path, monkeypatch):
    assert_a_failed_parity_publishes_nothing(kt_repository.run, tmp_path / "repo", monkeypatch, "explain")


@pytest.mark.parametrize("backend, graph", [(Backend.ONNXRUNTIME, "rank"), (Backend.PYTHON, "score")])
def test_explain_outputs_only_with_the_rank_graph_of_the_python_backend(backend, graph):
    options = TritonModelOptions(backend=backend, graph=graph, explain=True,
                                 parameters={"N_QUESTIONS": "5", "N_SKILLS": "3"})
    with pytest.raises(UserError, match="explain"):
        render_config("kt", options)
