"""`explain` on Predict and Recommend: why a prediction (docs/api.md, "Explanations").

A call with `explain` runs the version's explain graph (routerkt/contract/signature.py EXPLAIN,
explain.onnx; the rank model's extra outputs in Triton, export/triton_python_model/model.py) instead of
the rank graph; a call without it never reaches this module and costs what it did. Per candidate it
answers the `top_k` past interactions with the largest attention weight in the knowledge retriever's
last layer, and that layer's head weights (RouterKT: shared heads 1, the dynamic heads their routing
weight for this learner at the candidate, unselected 0; dense attention: all 1).

Weights. Per attended interaction: `head_attention[h]`, head h's attention from the candidate to it
(each head's row sums to at most 1 over the history; what is missing went to the candidate's own slot
or padding), and `weight`, their average weighted by the head weights (sum_h w_h a_h / sum_h w_h: the
heads the layer actually uses, in proportion; the plain mean for dense heads); interactions are ranked by
`weight`, ties oldest first. `position` indexes the history the gateway had (the request's `history`,
or the stored one for a learner_id): position history_length - history_used is the oldest the model saw.

Bad input: `explain.top_k` outside 1 .. window - 1 is INVALID_ARGUMENT naming it; a version exported
without the explain graph (or an attention-free model, DKT) is FAILED_PRECONDITION naming model and
version. An explained call is an inspection: it runs the primary version only (no shadow scoring) and
is not tracked (no prediction_id, no prediction record).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from routerkt.contract import signature
from routerkt.contract.signature import NO_SKILL
from serving import status_errors as errors
from serving.core.catalog import ModelVersion
from serving.status_errors import shown
from serving.core.encoded import EncodedLearner
from serving.pipeline.prediction import PredictionService
from serving.core.calls import ABSENT_SKILL, Deadline, LearnerQuery
from serving.core.validation import LearnerInput, check_model, validate_learner

DEFAULT_TOP_K = 5
OUTPUTS = signature.EXPLAIN.output_names       # candidate_probs, explain_attention, explain_head_weights


@dataclass
class Attended:
    """One past interaction a candidate attends to."""

    position: int                   # index in the learner's history (oldest first)
    question_id: int
    skill_ids: list[int]            # raw skill ids (the vocabulary's set when the history gave none)
    correct: bool
    weight: float                   # head-weighted mean of head_attention
    head_attention: list[float]     # per head of the explained layer


@dataclass
class Explanation:
    """One candidate's explanation."""

    attended: list[Attended]        # top_k by weight, largest first
    head_weights: list[float]       # [heads] the layer's weight of each head at this candidate


@dataclass
class ExplainedLearner:
    probabilities: np.ndarray       # float32 [C] (the explain graph's; equal to the rank graph's <= 1e-5)
    history_used: int
    version: int
    explanations: list[Explanation] = field(default_factory=list)


def check_top_k(top_k: int, window: int, name: str = "explain.top_k") -> int:
    """The top_k to answer with: 0 (unset) is min(DEFAULT_TOP_K, window - 1); else it must be in 1..window - 1."""
    if top_k == 0:
        return min(DEFAULT_TOP_K, window - 1)
    if not 1 <= top_k <= window - 1:
        raise errors.invalid_argument(name, f"must be in 1..{window - 1} (the model's window - 1), got {top_k}")
    return top_k


def explanations(attention: np.ndarray, head_weights: np.ndarray, learner: LearnerInput, encoded: EncodedLearner,
                 model: ModelVersion, top_k: int) -> list[Explanation]:
    """Per candidate, the top_k history interactions of `attention` [C, heads, window - 1] (left
    padded: the used history is the last history_used slots) with `head_weights` [C, heads]."""
    used = encoded.history_used
    first_slot = attention.shape[-1] - used
    offset = learner.history_length - used                      # position of the oldest used interaction
    out = []
    for a, w in zip(attention, head_weights):
        rows = a[:, first_slot:]                                # [heads, used]
        total = float(w.sum())
        mean = (w @ rows) / total if total > 0 else rows.mean(axis=0)
        order = sorted(range(used), key=lambda j: (-float(mean[j]), j))[:top_k]
        out.append(Explanation([_attended(learner, model, offset + j, float(mean[j]), rows[:, j]) for j in order],
                               [float(x) for x in w]))
    return out


def _attended(learner: LearnerInput, model: ModelVersion, position: int, weight: float, heads: np.ndarray) -> Attended:
    question = int(learner.history_questions[position])
    skills = [int(s) for s in learner.history_skills[position] if s != NO_SKILL]
    if not skills or learner.history_skills[position][0] == ABSENT_SKILL:
        skills = [int(s) for s in model.vocab.question_skills.get(question, [])]
    return Attended(position=position, question_id=question, skill_ids=skills,
                    correct=bool(learner.history_correct[position]), weight=weight,
                    head_attention=[float(x) for x in heads])


class ExplainService:
    """Predict with `explain` for one learner, composed of the prediction pipeline's public steps."""

    def __init__(self, service: PredictionService) -> None:
        self.service = service

    async def explain(self, model_name: str, version: int, query: LearnerQuery, top_k: int,
                      deadline: Deadline) -> ExplainedLearner:
        svc = self.service
        async with svc.call(deadline):
            check_model(model_name, version)
            learner = validate_learner(query, svc.settings, "")
            model = (await svc.resolve(model_name, version, [learner.learner_id]))[0].primary
            top_k = check_top_k(top_k, model.window)
            if not model.explain:
                raise errors.failed_precondition(
                    f"model {shown(model.name)} version {model.version} has no explain graph (exported before "
                    f"explanations, an attention-free model, or not served by the python backend); re-export it "
                    f"to explain")
            [learner] = await svc.complete_history([learner], model, deadline)
            [encoded] = svc.encode([learner], model)
            out = await svc.infer_outputs(model, encoded, OUTPUTS, deadline)
            n = encoded.n_candidates
            probs = np.asarray(out[OUTPUTS[0]][0, :n], dtype=np.float32)
            return ExplainedLearner(probs, encoded.history_used, model.version, explanations(
                out[OUTPUTS[1]][0, :n], out[OUTPUTS[2]][0, :n], learner, encoded, model, top_k))
