"""Structural validation of Predict / PredictBatch queries (no vocabulary needed).

Checks a PredictQuery (serving/core/calls.py) and returns one `LearnerInput` per learner, or raises
INVALID_ARGUMENT naming the first offending field, e.g. `history[3].correct` or
`learners[2].candidates`. Rules (the numbers come from Settings):

- `model` must be non-empty; `version` must be >= 0 (0 = latest);
- at most `max_history` interactions; at least one and at most `max_candidates` candidates;
- a batch has 1..`max_batch_learners` learners;
- question ids >= 0; skill ids >= 0, or -1 meaning "unknown skill", or absent (looked up from the
  question in the vocabulary later, serving/encoder/window.py); at most `max_skills_per_interaction`
  skills per set (the transports already refuse more, both forms at once and repeats while
  converting, serving/core/calls.py); `correct` is 0 or 1. A bad skill names its slot:
  `history[3].skill_ids[1]` for a set, `history[3].skill_id` for the single form.
An empty history is valid (cold start).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from serving.status_errors import invalid_argument
from serving.core.calls import INVALID_SKILL, NO_SKILL, LearnerQuery, PredictQuery, skill_field
from serving.core.revision import Revision
from serving.settings import Settings


@dataclass
class LearnerInput:
    """One learner's request in raw platform ids (validated structurally)."""

    history_questions: np.ndarray   # int64 [H]
    history_skills: np.ndarray      # int64 [H, K] raw skill sets (serving/core/calls.py: NO_SKILL padding,
                                    # first slot ABSENT_SKILL where not set, UNKNOWN_SKILL for -1)
    history_correct: np.ndarray     # int64 [H], 0/1
    candidate_questions: np.ndarray  # int64 [C]
    candidate_skills: np.ndarray    # int64 [C, K'] as above
    prefix: str = ""                # field prefix for error messages ("" or "learners[i].")
    learner_id: str = ""            # set: the history comes from the session store
    history_sets: np.ndarray | None = None    # bool [H]: rows given as skill_ids (for error names)
    candidate_sets: np.ndarray | None = None  # bool [C]
    learner_key: str = ""           # the learner id's keyed hash, set by the history source that read the store
    revision: Revision | None = None    # the store's log this history was read at (None: not from the store)
    cached: Any = None              # set: the learner-state cache entry this history continues, and the history
                                    # holds only the events stored after it (serving/sessions/history.py)

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
    questions, skills, correct = learner.history_questions, learner.history_skills, learner.history_correct
    candidate_questions, candidate_skills = learner.candidate_questions, learner.candidate_skills
    n_history, n_candidates = int(questions.shape[0]), int(candidate_questions.shape[0])
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

    max_skills = settings.max_skills_per_interaction
    if n_history:                                    # (an empty history, a Predict by learner_id: nothing to check)
        _first_bad(questions < 0, f"{prefix}history", "question_id", "must be >= 0")
        check_skills(skills, learner.history_sets, f"{prefix}history", max_skills)
        _first_bad((correct != 0) & (correct != 1), f"{prefix}history", "correct", "must be 0 or 1")
    _first_bad(candidate_questions < 0, f"{prefix}candidates", "question_id", "must be >= 0")
    check_skills(candidate_skills, learner.candidate_sets, f"{prefix}candidates", max_skills)
    return LearnerInput(questions, skills, correct, candidate_questions, candidate_skills, prefix, learner.learner_id,
                        learner.history_sets, learner.candidate_sets)


def check_skills(skills: np.ndarray, as_sets: np.ndarray | None, list_field: str, max_skills: int) -> None:
    """Raw skill sets [N, K]: INVALID_ARGUMENT naming the first slot set below -1
    (`list_field[i].skill_ids[j]` or `.skill_id`), or the first set of more than `max_skills`."""
    if skills.shape[1] > max_skills:
        _first_bad((skills != NO_SKILL).sum(axis=1) > max_skills, list_field, "skill_ids",
                   f"at most {max_skills} skills per interaction")
    bad = skills == INVALID_SKILL
    if bad.any():
        i, j = (int(x[0]) for x in np.nonzero(bad))
        raise invalid_argument(f"{list_field}[{i}].{skill_field(as_sets, i, j)}",
                               "must be >= 0, or -1 for an unknown skill")


def _first_bad(bad: np.ndarray, list_field: str, item_field: str, problem: str) -> None:
    """Raise INVALID_ARGUMENT for the first True in `bad`, naming `list_field[i].item_field`."""
    if bad.any():
        index = int(np.flatnonzero(bad)[0])
        raise invalid_argument(f"{list_field}[{index}].{item_field}", problem)
