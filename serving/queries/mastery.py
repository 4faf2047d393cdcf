"""Mastery: P(correct) per skill for one learner and model version, from one rank forward (docs/api.md, "Mastery").

"P(correct) on skill s" is the model's probability for a candidate with question UNK_ID and the skill
set {s} after the learner's history: the skill with no question-specific information. For the
Rasch-style backbones (AKT, SimpleKT) the unknown question's difficulty row is never trained (no
training interaction maps to UNK_ID) and stays at its zero init, so the candidate is the skill's
embedding alone, an "average question" of the skill; CL4KT embeds skills only and DKT scores the
skill directly, so there it is exactly the skill's score. All requested skills are the candidates of
ONE rank inference (history encoded once; a larger list is split into pieces of
MASTERY_CANDIDATES_PER_INFER). Mastery reads track nothing: no prediction_id, no sink, no outcome.
Bad input: an unknown, negative or repeated skill is INVALID_ARGUMENT naming `skill_ids[i]`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from routerkt.contract.signature import UNK_ID
from routerkt.contract.vocab import Vocab
from serving import status_errors as errors
from serving.pipeline.prediction import PredictionService
from serving.core.calls import ABSENT_SKILL, Deadline, LearnerQuery
from serving.core.validation import check_model, validate_learner

MASTERY_CANDIDATES_PER_INFER = 128     # skills per rank inference: assist2009 (110 skills) is one call


@dataclass
class MasteryQuery:
    model: str
    version: int                     # 0 = whichever version the version policy picks
    learner: LearnerQuery            # history or learner_id; its candidates are ignored
    skill_ids: np.ndarray | None = None   # raw skill ids int64 [S]; None or empty: every skill of the version


@dataclass
class MasteryResult:
    model: str
    version: int
    history_used: int
    skill_ids: np.ndarray            # raw ids int64 [S], in request order (all skills: ascending raw id)
    probabilities: np.ndarray        # float32 [S]


def model_skills(requested: np.ndarray | None, vocab: Vocab) -> tuple[np.ndarray, np.ndarray]:
    """(raw skill ids [S], model skill ids [S]) of the request, or of every skill of `vocab` when
    none is requested; INVALID_ARGUMENT naming `skill_ids[i]` for a negative, unknown or repeated id."""
    if requested is None or not len(requested):
        raw = np.array(sorted(vocab.skills), dtype=np.int64)
        return raw, vocab.encode_skills(raw.reshape(-1, 1)).reshape(-1)
    raw = np.asarray(requested, dtype=np.int64)
    bad = np.flatnonzero(raw < 0)
    if bad.size:
        raise errors.invalid_argument(f"skill_ids[{bad[0]}]", f"must be >= 0, got {int(raw[bad[0]])}")
    ids = vocab.encode_skills(raw.reshape(-1, 1)).reshape(-1)
    unknown = np.flatnonzero(ids == UNK_ID)
    if unknown.size:
        i = int(unknown[0])
        raise errors.invalid_argument(f"skill_ids[{i}]", f"unknown skill id {int(raw[i])} for this model version")
    _, first = np.unique(raw, return_index=True)
    repeated = np.setdiff1d(np.arange(raw.size), first)
    if repeated.size:
        i = int(repeated[0])
        raise errors.invalid_argument(f"skill_ids[{i}]", f"names skill {int(raw[i])} a second time")
    return raw, ids


class MasteryService:
    """Mastery, composed of the prediction pipeline's public steps (nothing tracked: no sink)."""

    def __init__(self, service: PredictionService) -> None:
        self.service = service

    async def mastery(self, query: MasteryQuery, deadline: Deadline) -> MasteryResult:
        svc = self.service
        async with svc.call(deadline):
            check_model(query.model, query.version)
            placeholder = dataclasses.replace(      # validation wants one candidate; mastery brings its own
                query.learner, candidate_questions=np.zeros(1, dtype=np.int64),
                candidate_skills=np.full((1, 1), ABSENT_SKILL, dtype=np.int64), candidate_sets=None)
            learner = validate_learner(placeholder, svc.settings, "")
            learner = dataclasses.replace(learner, candidate_questions=np.zeros(0, dtype=np.int64),
                                          candidate_skills=np.zeros((0, 1), dtype=np.int64))
            model = (await svc.resolve(query.model, query.version, [learner.learner_id]))[0].primary
            raw, ids = model_skills(query.skill_ids, model.vocab)
            [learner] = await svc.complete_history([learner], model, deadline)
            encoded = dataclasses.replace(svc.encode([learner], model)[0],
                                          candidate_questions=np.full(ids.shape, UNK_ID, dtype=np.int64),
                                          candidate_skills=ids.reshape(-1, 1).astype(np.int64))
            probs = (await svc.infer(model, [encoded], deadline,
                                     candidates_per_infer=MASTERY_CANDIDATES_PER_INFER))[0]
            return MasteryResult(model=model.name, version=model.version, history_used=encoded.history_used,
                                 skill_ids=raw, probabilities=probs)
