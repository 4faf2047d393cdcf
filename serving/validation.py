"""Structural validation of Predict / PredictBatch queries (no vocabulary needed).

Checks a PredictQuery (serving/requests.py) and returns one `LearnerInput` per learner, or raises
INVALID_ARGUMENT naming the first offending field, e.g. `history[3].correct` or
`learners[2].candidates`. Rules (the numbers come from Settings):

- `model` must be non-empty; `version` must be >= 0 (0 = latest);
- at most `max_history` interactions; at least one and at most `max_candidates` candidates;
- a batch has 1..`max_batch_learners` learners;
- question ids >= 0; skill ids >= 0, or -1 meaning "unknown skill", or absent (looked up from the
  question in the vocabulary later, serving/features.py); `correct` is 0 or 1.
An empty history is valid (cold start).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from serving.errors import invalid_argument
from serving.requests import ABSENT_SKILL, UNKNOWN_SKILL, LearnerQuery, PredictQuery
from serving.settings import Settings


@dataclass
class LearnerInput:
    """One learner's request in raw platform ids (validated structurally)."""

    history_questions: np.ndarray   # int64 [H]
    history_skills: np.ndarray      # int64 [H]; ABSENT_SKILL where not set, UNKNOWN_SKILL for -1
    history_correct: np.ndarray     # int64 [H], 0/1
    candidate_questions: np.ndarray  # int64 [C]
    candidate_skills: np.ndarray    # int64 [C]; ABSENT_SKILL / UNKNOWN_SKILL as above
    prefix: str = ""                # field prefix for error messages ("" or "learners[i].")
    learner_id: str = ""            # set: the history comes from the session store

    @property
    def history_length(self) -> int:
        return int(self.history_questions.shape[0])

    @property
    def n_candidates(self) -> int:
        return int(self.candidate_questions.shape[0])


def check_learner_id(learner_id: str, settings: Settings, field: str = "learner_id") -> None:
    if len(learner_id) > settings.max_learner_id_chars:
        raise invalid_argument(field, f"at most {settings.max_learner_id_chars} characters")
    if not learner_id.isprintable():
        raise invalid_argument(field, "must not contain control characters")


def check_model(model: str, version: int) -> None:
    if not model or not model.strip():
        raise invalid_argument("model", "a model name is required")
    if version < 0:
        raise invalid_argument("version", f"must be >= 0 (0 = latest), got {version}")


def validate_query(query: PredictQuery, settings: Settings) -> list[LearnerInput]:
    """A Predict or PredictBatch query -> one LearnerInput per learner, or INVALID_ARGUMENT."""
    check_model(query.model, query.version)
    if query.batch:
        n = len(query.learners)
        if n == 0:
            raise invalid_argument("learners", "at least one learner is required")
        if n > settings.max_batch_learners:
            raise invalid_argument("learners", f"at most {settings.max_batch_learners} learners per call, got {n}")
    return [validate_learner(learner, settings, query.prefix(i)) for i, learner in enumerate(query.learners)]


def validate_learner(learner: LearnerQuery, settings: Settings, prefix: str) -> LearnerInput:
    hq, hs, hc = learner.history_questions, learner.history_skills, learner.history_correct
    cq, cs = learner.candidate_questions, learner.candidate_skills
    n_history, n_candidates = int(hq.shape[0]), int(cq.shape[0])
    if learner.learner_id:
        check_learner_id(learner.learner_id, settings, f"{prefix}learner_id")
        if n_history:
            raise invalid_argument(f"{prefix}history", "must be empty when learner_id is set "
                                                       "(the history comes from the session store)")
    if n_history > settings.max_history:
        raise invalid_argument(f"{prefix}history",
                               f"at most {settings.max_history} interactions, got {n_history}")
    if n_candidates == 0:
        raise invalid_argument(f"{prefix}candidates", "at least one candidate question is required")
    if n_candidates > settings.max_candidates:
        raise invalid_argument(f"{prefix}candidates",
                               f"at most {settings.max_candidates} candidates, got {n_candidates}")

    h_set, c_set = hs != ABSENT_SKILL, cs != ABSENT_SKILL      # INVALID_SKILL is set and < -1: rejected
    skill_rule = "must be >= 0, or -1 for an unknown skill"
    _first_bad(hq < 0, f"{prefix}history", "question_id", "must be >= 0")
    _first_bad(h_set & (hs < UNKNOWN_SKILL), f"{prefix}history", "skill_id", skill_rule)
    _first_bad((hc != 0) & (hc != 1), f"{prefix}history", "correct", "must be 0 or 1")
    _first_bad(cq < 0, f"{prefix}candidates", "question_id", "must be >= 0")
    _first_bad(c_set & (cs < UNKNOWN_SKILL), f"{prefix}candidates", "skill_id", skill_rule)
    return LearnerInput(hq, hs, hc, cq, cs, prefix, learner.learner_id)


def _first_bad(bad: np.ndarray, list_field: str, item_field: str, problem: str) -> None:
    """Raise INVALID_ARGUMENT for the first True in `bad`, naming `list_field[i].item_field`."""
    if bad.any():
        index = int(np.flatnonzero(bad)[0])
        raise invalid_argument(f"{list_field}[{index}].{item_field}", problem)
