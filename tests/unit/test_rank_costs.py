"""`routerkt bench ranking --mastery` (loadtest/rank_costs.py): the temporary repository that serves a
version with its explain graph and, as `<name>-no-explain`, without it; and the calls it times."""
from __future__ import annotations

from pathlib import Path

import pytest

from export.triton_config import PARAM_N_QUESTIONS, PARAM_N_SKILLS, TritonModelOptions, render_config
from loadtest.rank_costs import NO_EXPLAIN_ROW, calls, with_and_without_explain
from routerkt.contract import signature
from routerkt.contract.repository_reader import parse_triton_config, read_served_shape
from serving.api import knowledge_tracing_pb2 as pb

pytestmark = pytest.mark.unit

FILES = (signature.RANK_ONNX_FILE, signature.EXPLAIN_ONNX_FILE, signature.ONNX_FILE, signature.VOCAB_FILE,
         signature.INFO_FILE, "model.py")


def exported(root: Path, name: str, version: int) -> Path:
    """A repository holding `name` version `version` as exported with the explain graph (placeholder files)."""
    folder = root / name / str(version)
    (folder / "__pycache__").mkdir(parents=True)
    for file in FILES:
        (folder / file).write_text(file)
    options = TritonModelOptions(window=20, graph=signature.RANK.name, explain=True,
                                 parameters={PARAM_N_QUESTIONS: "50", PARAM_N_SKILLS: "12"})
    (root / name / signature.CONFIG_FILE).write_text(render_config(name, options))
    return root


def test_the_version_is_served_with_and_without_its_explain_graph(tmp_path: Path) -> None:
    source = exported(tmp_path / "source", "kt", 3)
    out = tmp_path / "repo"
    plain = with_and_without_explain(source, "kt", 3, out)
    assert plain == "kt-no-explain" and sorted(p.name for p in out.iterdir()) == ["kt", plain]
    assert sorted(p.name for p in (out / "kt" / "3").iterdir()) == sorted(FILES)
    assert sorted(p.name for p in (out / plain / "3").iterdir()) == sorted(set(FILES) - {signature.EXPLAIN_ONNX_FILE})
    assert (out / "kt" / signature.CONFIG_FILE).read_text() == (source / "kt" / signature.CONFIG_FILE).read_text()
    with_graph, without = read_served_shape(out, "kt"), read_served_shape(out, plain)
    assert with_graph.output_names == signature.EXPLAIN.output_names
    assert without.output_names == signature.RANK.output_names
    assert without.input_names == with_graph.input_names and without.input_dims == with_graph.input_dims
    config = parse_triton_config((out / plain / signature.CONFIG_FILE).read_text())
    assert config.name == plain                                 # Triton wants the folder's name
    assert config == parse_triton_config(render_config(plain, TritonModelOptions(
        window=20, graph=signature.RANK.name, parameters={PARAM_N_QUESTIONS: "50", PARAM_N_SKILLS: "12"})))


def test_the_explain_rows_only_with_the_explain_graph() -> None:
    questions = list(range(2, 40))
    assert list(calls(pb, "kt", questions, 20, None)) == ["predict 1", "predict 20", "predict 64",
                                                          "mastery, every skill"]
    requests = calls(pb, "kt", questions, 20, "kt-no-explain")
    for n in (1, 20):
        method, explained = requests[f"predict {n} explain"]
        assert method == "Predict" and explained.explain.top_k == 5 and len(explained.candidates) == n
        method, plain = requests[NO_EXPLAIN_ROW.format(n=n)]
        assert plain.model == "kt-no-explain" and not plain.HasField("explain")
        assert plain.candidates == requests[f"predict {n}"][1].candidates
        assert plain.history == requests[f"predict {n}"][1].history
