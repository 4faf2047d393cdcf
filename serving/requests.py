"""The transport-independent request and response types of the serving core.

Transports (serving/transport/grpc_api.py, serving/transport/http_api.py) turn their messages into these plain dataclasses
and back; nothing below them sees protobuf or JSON. A learner travels as numpy arrays of the
platform's raw ids, built once at the edge (no per-interaction Python objects further in):

    skill ids: >= 0 a real skill, UNKNOWN_SKILL (-1) "the platform does not know it",
               ABSENT_SKILL (-2) not set (looked up from the question in the vocabulary),
               INVALID_SKILL (-3) set to a value below -1 (validation rejects it, naming the field).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from serving import errors

UNKNOWN_SKILL = -1       # an explicit "the platform does not know this question's skill"
ABSENT_SKILL = -2        # skill_id not set; resolved from the vocabulary (serving/features.py)
INVALID_SKILL = -3       # skill_id set below -1: kept apart from "not set" so validation rejects it


def skill_array(values: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Raw skill ids int64 [N] and whether each was set, bool [N] -> the encoding above."""
    values = np.asarray(values, dtype=np.int64)
    return np.where(present, np.where(values < UNKNOWN_SKILL, INVALID_SKILL, values), ABSENT_SKILL)


def column_arrays(questions: Sequence[int], skills: Sequence[int], correct: Sequence[int],
                  field: str, messages: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A history given as columns (HistoryColumns, gRPC or HTTP) -> (questions, skills, correct),
    int64 [H] each, skills encoded as skill_array does (an empty skills column: every skill absent).
    INVALID_ARGUMENT naming `field` when the request also has `messages` > 0 history entries in the
    message form, or `field`.<column> when a column's length differs from questions'."""
    if messages:
        raise errors.invalid_argument(field, "set either history or history_columns, not both")
    n = len(questions)
    if len(correct) != n:
        raise errors.invalid_argument(f"{field}.correct", f"must have one entry per question id ({n}), got {len(correct)}")
    if len(skills) not in (0, n):
        raise errors.invalid_argument(f"{field}.skill_ids", f"must be empty or have one entry per question id "
                                                            f"({n}), got {len(skills)}")
    skill_ids = (skill_array(np.fromiter(skills, dtype=np.int64, count=n), np.ones(n, dtype=bool)) if len(skills)
                 else np.full(n, ABSENT_SKILL, dtype=np.int64))
    return np.fromiter(questions, dtype=np.int64, count=n), skill_ids, np.fromiter(correct, dtype=np.int64, count=n)


@dataclass
class LearnerQuery:
    """One learner's history (oldest first) and candidate questions, in raw platform ids."""

    history_questions: np.ndarray    # int64 [H]
    history_skills: np.ndarray       # int64 [H]; ABSENT_SKILL where not set
    history_correct: np.ndarray      # int64 [H] (validated to 0/1 later)
    candidate_questions: np.ndarray  # int64 [C]
    candidate_skills: np.ndarray     # int64 [C]; ABSENT_SKILL where not set
    learner_id: str = ""             # set: the history comes from the session store (never logged)

    @classmethod
    def from_values(cls, history: Iterable[tuple[int, int | None, int]],
                    candidates: Iterable[tuple[int, int | None]], learner_id: str = "") -> LearnerQuery:
        """From (question, skill or None, correct) and (question, skill or None) tuples."""
        history, candidates = list(history), list(candidates)

        def skills(items: list) -> np.ndarray:
            return skill_array(np.array([0 if i[1] is None else i[1] for i in items], dtype=np.int64),
                               np.array([i[1] is not None for i in items], dtype=bool))
        return cls(np.array([h[0] for h in history], dtype=np.int64), skills(history),
                   np.array([h[2] for h in history], dtype=np.int64),
                   np.array([c[0] for c in candidates], dtype=np.int64), skills(candidates), learner_id)


@dataclass
class PredictQuery:
    """Predict (one learner, `batch` False) or PredictBatch (`batch` True) against `model`."""

    model: str
    version: int                     # 0 = whichever version the version policy picks
    learners: list[LearnerQuery]
    batch: bool = False

    def prefix(self, index: int) -> str:
        """Field prefix of learner `index` in error messages: "" or "learners[i]."."""
        return f"learners[{index}]." if self.batch else ""


@dataclass
class LearnerPrediction:
    probabilities: np.ndarray        # float32 [C], one per candidate, in request order
    history_used: int                # interactions that reached the model (at most window - 1)
    version: int = 0                 # the version that answered this learner
    prediction_id: str = ""          # for ReportOutcome (outcome tracking on, learner not named by id)


@dataclass
class PredictResult:
    model: str
    version: int                     # the version that answered every learner; 0 when a canary split them
    learners: list[LearnerPrediction]


@dataclass
class Deadline:
    """Absolute deadline on the monotonic clock."""

    expires_at: float = field(default_factory=time.monotonic)

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def remaining(self) -> float:
        return self.expires_at - time.monotonic()
