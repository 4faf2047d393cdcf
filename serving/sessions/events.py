"""Observe / ForgetLearner queries (transport-independent) and their validation.

Rules (numbers from Settings): `learner_id` 1..max_learner_id_chars characters, no control
characters; 1..max_observe_events events per call; each event: an `event_id` of
1..max_event_id_chars characters, unique within the call; question_id >= 0; skill_id (one) or
skill_ids (a set of at most max_skills_per_interaction, none twice; not both forms: checked while
converting, serving/core/calls.py), each >= 0 or -1 (unknown), or absent; correct 0 or 1;
timestamp_ms >= 0 when set. The first problem raises INVALID_ARGUMENT naming the field
(`events[3].correct`, `events[2].skill_ids[1]`) and nothing is stored.

Ids are the platform's own and are stored as given, whether or not a served model version knows
them: a question or skill added to the platform after the served version was trained is stored
(a prediction maps it to the unknown id, serving/encoder/window.py), exported by `routerkt sessions
export`, and given an id of its own by `routerkt retrain`'s grown vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from serving.status_errors import invalid_argument
from serving.core.calls import INVALID_SKILL, NO_SKILL, skill_field
from serving.sessions.store import NO_TIMESTAMP
from serving.settings import Settings
from serving.core.validation import check_learner_id as check_optional_learner_id


@dataclass
class ObserveQuery:
    learner_id: str
    event_ids: list[str]
    questions: np.ndarray       # int64 [E]
    skills: np.ndarray          # int64 [E, K] skill sets, serving/core/calls.py encoding (ABSENT_SKILL, INVALID_SKILL)
    correct: np.ndarray         # int64 [E]
    timestamps: np.ndarray      # int64 [E], NO_TIMESTAMP where not set; INVALID_TIMESTAMP where < 0
    skill_sets: np.ndarray | None = None   # bool [E]: given as skill_ids (errors name skill_ids[j]); None: none

    def stored_skills(self) -> list[tuple[int, ...]]:
        """Each event's skill set as a tuple (empty: not set, looked up from the question when read)."""
        if self.skills.shape[1] == 1:
            return [() if s == NO_SKILL else (s,) for s in self.skills[:, 0].tolist()]
        return [tuple(s for s in row if s != NO_SKILL) for row in self.skills.tolist()]


INVALID_TIMESTAMP = -2


def check_learner_id(learner_id: str, settings: Settings, field: str = "learner_id") -> None:
    """A required learner id (Observe, ForgetLearner): present, bounded, printable."""
    if not learner_id:
        raise invalid_argument(field, "a learner id is required")
    check_optional_learner_id(learner_id, settings, field)


def validate_observe(query: ObserveQuery, settings: Settings) -> None:
    """Raise INVALID_ARGUMENT for the first bad field."""
    check_learner_id(query.learner_id, settings)
    n = len(query.event_ids)
    if n == 0:
        raise invalid_argument("events", "at least one event is required")
    if n > settings.max_observe_events:
        raise invalid_argument("events", f"at most {settings.max_observe_events} events per call, got {n}")
    seen: dict[str, int] = {}
    for i, event_id in enumerate(query.event_ids):
        if not event_id:
            raise invalid_argument(f"events[{i}].event_id", "an event id is required")
        if len(event_id) > settings.max_event_id_chars:
            raise invalid_argument(f"events[{i}].event_id", f"at most {settings.max_event_id_chars} characters")
        if event_id in seen:
            raise invalid_argument(f"events[{i}].event_id", f"repeats events[{seen[event_id]}].event_id")
        seen[event_id] = i
    _first_bad(query.questions < 0, "question_id", "must be >= 0")
    _first_slot((query.skills != NO_SKILL).sum(axis=1, keepdims=True) > settings.max_skills_per_interaction,
                None, "skill_ids", f"at most {settings.max_skills_per_interaction} skills per event")
    _first_slot(query.skills == INVALID_SKILL, query.skill_sets, "", "must be >= 0, or -1 for an unknown skill")
    _first_bad((query.correct != 0) & (query.correct != 1), "correct", "must be 0 or 1")
    _first_bad(query.timestamps == INVALID_TIMESTAMP, "timestamp_ms", "must be >= 0")


def timestamp_array(values: np.ndarray, present: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=np.int64)
    return np.where(present, np.where(values < 0, INVALID_TIMESTAMP, values), NO_TIMESTAMP)


def _first_slot(bad: np.ndarray, skill_sets: np.ndarray | None, item_field: str, problem: str) -> None:
    """`bad` bool [E, K]: INVALID_ARGUMENT naming the first bad slot (`events[i].skill_ids[j]` or
    `events[i].skill_id`), or `events[i].<item_field>` when one is given."""
    if bad.any():
        i, j = (int(x[0]) for x in np.nonzero(bad))
        raise invalid_argument(f"events[{i}].{item_field or skill_field(skill_sets, i, j)}", problem)


def _first_bad(bad: np.ndarray, item_field: str, problem: str) -> None:
    if bad.any():
        index = int(np.flatnonzero(bad)[0])
        raise invalid_argument(f"events[{index}].{item_field}", problem)
