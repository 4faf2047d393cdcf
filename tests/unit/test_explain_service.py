"""serving/queries/explain.py without a backend: top-k by the head-weighted attention, positions in the
learner's history, skills resolved from the vocabulary where the history gave none, top_k bounds."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from routerkt.contract.signature import NO_SKILL
from serving.status_errors import ServingError
from serving.queries.explain import DEFAULT_TOP_K, check_top_k, explanations
from serving.encoder.window import EncodedLearner
from serving.core.validation import LearnerInput

pytestmark = pytest.mark.unit


def test_top_k_by_head_weighted_attention_with_history_positions() -> None:
    learner = LearnerInput(history_questions=np.array([7, 8, 9, 10, 11]),
                           history_skills=np.array([[1, NO_SKILL], [2, NO_SKILL], [NO_SKILL, NO_SKILL],
                                                    [3, 4], [5, NO_SKILL]]),
                           history_correct=np.array([1, 0, 1, 0, 1]), candidate_questions=np.array([1]),
                           candidate_skills=np.array([[1]]))
    used = 3                                       # the model saw positions 2, 3, 4 (window 6: 5 slots)
    encoded = EncodedLearner(np.zeros(used, np.int64), np.zeros((used, 1), np.int64), np.zeros(used, np.int64),
                             np.zeros(1, np.int64), np.zeros((1, 1), np.int64))
    model = SimpleNamespace(vocab=SimpleNamespace(question_skills={9: [6]}))
    attention = np.array([[[0, 0, 0.1, 0.5, 0.2], [0, 0, 0.6, 0.1, 0.1]]], dtype=np.float32)  # [C, heads, 5]
    weights = np.array([[1.0, 0.25]], dtype=np.float32)
    [e] = explanations(attention, weights, learner, encoded, model, top_k=2)
    mean = (weights[0] @ attention[0][:, 2:]) / 1.25
    assert [a.position for a in e.attended] == [3, 2]          # mean: [0.2, 0.42, 0.18]
    assert [a.weight for a in e.attended] == pytest.approx([mean[1], mean[0]])
    assert e.attended[0].skill_ids == [3, 4] and e.attended[0].correct is False
    assert e.attended[1].skill_ids == [6]                      # no skill in the history: the vocabulary's
    assert e.attended[0].head_attention == pytest.approx([0.5, 0.1]) and e.head_weights == [1.0, 0.25]


def test_top_k_bounds_name_the_field() -> None:
    assert check_top_k(0, 20) == DEFAULT_TOP_K and check_top_k(0, 4) == 3 and check_top_k(19, 20) == 19
    for bad in (20, -1):
        with pytest.raises(ServingError, match="explain.top_k"):
            check_top_k(bad, 20)


def test_the_triton_model_names_the_explain_graph_as_the_signature() -> None:
    import ast

    from export.triton_python_model import MODEL_PY
    from routerkt.contract import signature
    found = {n.targets[0].id: n.value for n in ast.parse(MODEL_PY.read_text()).body
             if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)}
    literal = {k: ast.literal_eval(v) for k, v in found.items() if isinstance(v, ast.Constant)}
    assert (literal["EXPLAIN_ATTENTION"], literal["EXPLAIN_HEAD_WEIGHTS"]) == (signature.EXPLAIN_ATTENTION,
                                                                                 signature.EXPLAIN_HEAD_WEIGHTS)
    assert literal["EXPLAIN_ONNX_FILE"] == signature.EXPLAIN_ONNX_FILE
    assert signature.EXPLAIN.output_names[0] == signature.CANDIDATE_PROBS
