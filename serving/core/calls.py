"""The transport-independent request and response types of the serving core.

Transports (serving/transport/grpc_api.py, serving/transport/http_routes.py) turn their messages into
these plain dataclasses and back; nothing below them sees protobuf or JSON. A learner travels as numpy arrays of the
platform's raw ids, built once at the edge (no per-interaction Python objects further in):

    skills: one row per interaction (or candidate) holding its skill SET, int64 [N, K] (K >= 1, the
            widest set of the learner), left-packed, NO_SKILL (-2, routerkt/contract/signature.py)
            in unused slots. A slot: >= 0 a real skill, UNKNOWN_SKILL (-1) "the platform does not
            know it", INVALID_SKILL (-3) set to a value below -1 (validation rejects it, naming the
            field). A row whose first slot is ABSENT_SKILL (= NO_SKILL: an empty set) was not set:
            its question's set is looked up in the vocabulary (serving/encoder/window.py).
    A request gives an interaction's skills as `skill_id` (one) or `skill_ids` (a set), never both;
    `skill_sets` turns either form into these rows (single-skill traffic stays one vectorised pass).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence, Union

import numpy as np

from routerkt.contract.signature import NO_SKILL
from serving import status_errors as errors

UNKNOWN_SKILL = -1       # an explicit "the platform does not know this question's skill"
ABSENT_SKILL = NO_SKILL  # an unused slot; in the first slot: no skill set, resolved from the vocabulary
INVALID_SKILL = -3       # a skill set below -1: kept apart from "not set" so validation rejects it
DEFAULT_MAX_SKILLS = 8   # Settings.max_skills_per_interaction's default


def skill_array(values: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Raw skill ids int64 [N] and whether each was set, bool [N] -> rows [N, 1] of the encoding above."""
    values = np.asarray(values, dtype=np.int64)
    return np.where(present, np.where(values < UNKNOWN_SKILL, INVALID_SKILL, values), ABSENT_SKILL).reshape(-1, 1)


def skill_sets(single: np.ndarray, present: np.ndarray, sets: Sequence[Sequence[int]] | None, field: str,
               max_skills: int = DEFAULT_MAX_SKILLS) -> tuple[np.ndarray, np.ndarray | None]:
    """The skills of N interactions (or candidates, events) given as `skill_id` (`single` int64 [N],
    `present` bool [N]) or `skill_ids` (`sets`: one sequence per item, empty where not given; None:
    no item has one, the single-skill fast path) -> (rows [N, K] encoded as above, `as_sets`: bool [N]
    True where the item gave skill_ids, None when none did; errors name `skill_ids[j]` there).
    INVALID_ARGUMENT naming `field[i].skill_ids` for both forms at once, more than `max_skills`
    skills or a skill twice in one set."""
    rows = skill_array(single, present)
    if sets is None:
        return rows, None
    n = rows.shape[0]
    lengths = np.fromiter(map(len, sets), dtype=np.int64, count=n)
    if not lengths.any():
        return rows, None
    as_sets = lengths > 0
    _first(as_sets & np.asarray(present, dtype=bool), field, "skill_ids", "set either skill_id or skill_ids, not both")
    _first(lengths > max_skills, field, "skill_ids", f"at most {max_skills} skills per interaction")
    values = np.fromiter((s for items in sets for s in items), dtype=np.int64, count=int(lengths.sum()))
    return ragged_rows(rows, as_sets, lengths, values, field), as_sets


def ragged_rows(rows: np.ndarray, as_sets: np.ndarray, lengths: np.ndarray, values: np.ndarray,
                field: str) -> np.ndarray:
    """`rows` [N, 1] widened to [N, max(lengths)], the sets' `values` (ragged by `lengths`) written
    into the rows where `as_sets`; a skill twice in one set: INVALID_ARGUMENT naming `field[i].skill_ids`."""
    width = max(int(lengths.max()), 1)
    out = np.full((rows.shape[0], width), NO_SKILL, dtype=np.int64)
    out[:, :1] = rows
    out[as_sets, 0] = NO_SKILL
    item = np.repeat(np.arange(rows.shape[0]), lengths)
    slot = np.arange(values.shape[0]) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[item, slot] = np.where(values < UNKNOWN_SKILL, INVALID_SKILL, values)
    if width > 1:
        ordered = np.sort(out, axis=1)
        repeats = ((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] != NO_SKILL)).any(axis=1)
        _first(repeats, field, "skill_ids", "names a skill more than once")
    return out


def _first(bad: np.ndarray, list_field: str, item_field: str, problem: str) -> None:
    """INVALID_ARGUMENT naming `list_field[i].item_field` (or `list_field[i]`) for the first True i."""
    if bad.any():
        name = f"{list_field}[{int(np.flatnonzero(bad)[0])}]"
        raise errors.invalid_argument(f"{name}.{item_field}" if item_field else name, problem)


def skill_field(as_sets: np.ndarray | None, index: int, slot: int) -> str:
    """The request field of slot `slot` of item `index`'s skills: `skill_ids[slot]` or `skill_id`."""
    return f"skill_ids[{slot}]" if as_sets is not None and as_sets[index] else "skill_id"


def column_arrays(questions: Sequence[int], skills: Sequence[int], correct: Sequence[int],
                  field: str, messages: int = 0, skill_lengths: Sequence[int] = (), skill_values: Sequence[int] = (),
                  max_skills: int = DEFAULT_MAX_SKILLS) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """A history given as columns (HistoryColumns, gRPC or HTTP) -> (questions [H], skills [H, K],
    correct [H], as_sets), skills as `skill_sets` gives them: from `skills` (one id per interaction;
    empty: every set absent) or the ragged `skill_lengths` + `skill_values` (as_sets then marks the
    interactions with a length > 0; length 0 = absent). INVALID_ARGUMENT naming `field` when the
    request also has `messages` > 0 history entries in the message form, `field`.<column> when a
    column's length differs from questions', both skill forms are set, a length is negative or over
    `max_skills`, or the lengths do not add up to len(skill_values)."""
    if messages:
        raise errors.invalid_argument(field, "set either history or history_columns, not both")
    n = len(questions)
    if len(correct) != n:
        raise errors.invalid_argument(f"{field}.correct",
                                      f"must have one entry per question id ({n}), got {len(correct)}")
    if len(skills) not in (0, n):
        raise errors.invalid_argument(f"{field}.skill_ids", f"must be empty or have one entry per question id "
                                                            f"({n}), got {len(skills)}")
    question_ids = np.fromiter(questions, dtype=np.int64, count=n)
    answers = np.fromiter(correct, dtype=np.int64, count=n)
    if len(skill_lengths) or len(skill_values):
        rows, as_sets = _ragged_column(n, len(skills), skill_lengths, skill_values, field, max_skills)
        return question_ids, rows, answers, as_sets
    skill_ids = (skill_array(np.fromiter(skills, dtype=np.int64, count=n), np.ones(n, dtype=bool)) if len(skills)
                 else np.full((n, 1), ABSENT_SKILL, dtype=np.int64))
    return question_ids, skill_ids, answers, None


def _ragged_column(n: int, singles: int, skill_lengths: Sequence[int], skill_values: Sequence[int], field: str,
                   max_skills: int) -> tuple[np.ndarray, np.ndarray]:
    """HistoryColumns' skill_lengths + skill_values -> (rows [n, K], as_sets [n]); see column_arrays."""
    if singles:
        raise errors.invalid_argument(f"{field}.skill_lengths", "set either skill_ids or skill_lengths with "
                                                                "skill_values, not both")
    if len(skill_lengths) != n:
        raise errors.invalid_argument(f"{field}.skill_lengths", f"must have one entry per question id ({n}), "
                                                                f"got {len(skill_lengths)}")
    lengths = np.fromiter(skill_lengths, dtype=np.int64, count=n)
    _first(lengths < 0, f"{field}.skill_lengths", "", "must be >= 0")
    _first(lengths > max_skills, f"{field}.skill_lengths", "", f"at most {max_skills} skills per interaction")
    if int(lengths.sum()) != len(skill_values):
        raise errors.invalid_argument(f"{field}.skill_lengths", f"the lengths add up to {int(lengths.sum())}, "
                                                                f"but skill_values has {len(skill_values)} entries")
    values = np.fromiter(skill_values, dtype=np.int64, count=len(skill_values))
    as_sets = lengths > 0
    absent = np.full((n, 1), ABSENT_SKILL, dtype=np.int64)
    return ragged_rows(absent, as_sets, lengths, values, field.removesuffix("_columns")), as_sets


@dataclass
class LearnerQuery:
    """One learner's history (oldest first) and candidate questions, in raw platform ids."""

    history_questions: np.ndarray    # int64 [H]
    history_skills: np.ndarray       # int64 [H, K] skill sets; first slot ABSENT_SKILL where not set
    history_correct: np.ndarray      # int64 [H] (validated to 0/1 later)
    candidate_questions: np.ndarray  # int64 [C]
    candidate_skills: np.ndarray     # int64 [C, K'] as history_skills
    learner_id: str = ""             # set: the history comes from the session store (never logged)
    history_sets: np.ndarray | None = None    # bool [H]: given as skill_ids (errors name skill_ids[j]); None: none
    candidate_sets: np.ndarray | None = None  # bool [C], the same for the candidates

    @classmethod
    def from_values(cls, history: Iterable[tuple[int, SkillValue, int]], candidates: Iterable[tuple[int, SkillValue]],
                    learner_id: str = "", max_skills: int = DEFAULT_MAX_SKILLS, prefix: str = "") -> LearnerQuery:
        """From (question, skill, correct) and (question, skill) tuples, a skill being None (not
        set), one id (skill_id) or a list of ids (skill_ids); `prefix` names the learner in errors."""
        history, candidates = list(history), list(candidates)
        history_skills, history_sets = value_sets([h[1] for h in history], f"{prefix}history", max_skills)
        candidate_skills, candidate_sets = value_sets([c[1] for c in candidates], f"{prefix}candidates", max_skills)
        return cls(np.array([h[0] for h in history], dtype=np.int64), history_skills,
                   np.array([h[2] for h in history], dtype=np.int64),
                   np.array([c[0] for c in candidates], dtype=np.int64), candidate_skills, learner_id,
                   history_sets, candidate_sets)


SkillValue = Union[int, Sequence[int], None]


def value_sets(values: list[SkillValue], field: str, max_skills: int = DEFAULT_MAX_SKILLS
               ) -> tuple[np.ndarray, np.ndarray | None]:
    """Skills as None / an id / a list of ids per item -> `skill_sets`' (rows, as_sets)."""
    single = [v if isinstance(v, int) else 0 for v in values]
    present = [isinstance(v, int) for v in values]
    sets = [v for v in values if v is not None and not isinstance(v, int)]
    return skill_sets(np.array(single, dtype=np.int64), np.array(present, dtype=bool),
                      [() if v is None or isinstance(v, int) else v for v in values] if sets else None, field,
                      max_skills)


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
    learner_key: str = ""            # named by learner_id: its keyed hash, made once per call (never shown)


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
