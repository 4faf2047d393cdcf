"""The vocabulary: raw question / skill ids of a data set -> the model's embedding ids.

Conventions (routerkt/contract/signature.py): PAD_ID = 0 (padding), UNK_ID = 1 (unknown id, and every raw -1),
real ids from FIRST_ID = 2 in ascending order of the raw id, so building twice from the same data
gives the same mapping. `question_skills` keeps, for each raw question, the raw skill SET of its
first occurrence with a known skill ((-1,) if it never had one); the gateway uses it when a request
names a question without its skills. Raw skill sets travel as rows of K raw ids padded with
NO_SKILL (routerkt/contract/signature.py).

The vocabulary travels with a model into the Triton repository as `vocab.json`:

    {"format": "routerkt-vocab/2", "pad_id": 0, "unk_id": 1,
     "questions": {"<raw>": id, ...}, "skills": {"<raw>": id, ...},
     "question_skills": {"<raw question>": [raw_skill, ...], ...}}

Format 1 files (one skill per question, "question_skill": {"<raw question>": raw_skill}) still read.

No torch and no training code here: export writes this file, the serving gateway reads it.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from typing import Protocol

from routerkt.atomic import atomic_write_json
from routerkt.contract.json_file import read_json
from routerkt.contract.signature import FIRST_ID, NO_SKILL, PAD_ID, UNK_ID
from routerkt.errors import UserError

FORMAT = "routerkt-vocab/2"
FORMAT_V1 = "routerkt-vocab/1"      # one skill per question; read, never written


class VocabError(UserError):
    """A vocabulary file or object is missing or malformed; str(error) is `<where>: <problem>`."""


class RawIds(Protocol):
    """What `Vocab.build` reads: raw question ids [N] and skill ids, [N] or skill sets [N, K]
    (NO_SKILL in unused slots; -1 = unknown)."""

    question_id: np.ndarray
    skill_id: np.ndarray


def as_skill_sets(raw: np.ndarray) -> np.ndarray:
    """Raw skill ids [N] (one per interaction) or sets [N, K] -> sets [N, K >= 1]."""
    raw = np.asarray(raw, dtype=np.int64)
    return raw.reshape(-1, 1) if raw.ndim == 1 else raw


def set_tuple(row: np.ndarray) -> tuple[int, ...]:
    """One raw set row -> its skills in slot order ((-1,) when it holds none)."""
    skills = tuple(int(s) for s in row if s != NO_SKILL)
    return skills or (-1,)


def _index(raw_ids: np.ndarray) -> dict[int, int]:
    """Distinct known raw ids (>= 0: not -1 nor NO_SKILL), ascending -> FIRST_ID, FIRST_ID + 1, ..."""
    known = np.unique(raw_ids[raw_ids >= 0])
    return {int(r): FIRST_ID + i for i, r in enumerate(known)}


def _lookup_table(mapping: dict[int, int]) -> tuple[np.ndarray, np.ndarray]:
    keys = np.fromiter(mapping.keys(), dtype=np.int64, count=len(mapping))
    values = np.fromiter(mapping.values(), dtype=np.int64, count=len(mapping))
    order = np.argsort(keys, kind="stable")
    return keys[order], values[order]


def _encode(table: tuple[np.ndarray, np.ndarray], raw: np.ndarray, default: int) -> np.ndarray:
    keys, values = table
    raw = np.asarray(raw, dtype=np.int64)
    if keys.size == 0:
        return np.full(raw.shape, default, dtype=np.int64)
    pos = np.minimum(np.searchsorted(keys, raw), keys.size - 1)
    return np.where(keys[pos] == raw, values[pos], default).astype(np.int64)


class Vocab:
    """Raw id -> model id for questions and skills, and raw question -> its raw skill set."""

    def __init__(self, questions: dict[int, int], skills: dict[int, int],
                 question_skill: dict[int, int] | None = None,
                 question_skills: dict[int, tuple[int, ...]] | None = None) -> None:
        self.questions = questions          # raw question id -> model id (>= FIRST_ID)
        self.skills = skills                # raw skill id -> model id (>= FIRST_ID)
        if question_skills is None:         # one skill per question (format 1, older callers)
            question_skills = {q: (s,) for q, s in (question_skill or {}).items()}
        # raw question id -> raw skill set of its first occurrence with a known skill ((-1,) = none)
        self.question_skills = {q: tuple(int(s) for s in skill_set) or (-1,)
                                for q, skill_set in question_skills.items()}
        self._tables: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._sets: np.ndarray | None = None
        self._max_skills: int | None = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and (self.questions, self.skills, self.question_skills) == \
            (other.questions, other.skills, other.question_skills)

    def __repr__(self) -> str:
        return f"Vocab({len(self.questions)} questions, {len(self.skills)} skills)"

    @property
    def question_skill(self) -> dict[int, int]:
        """Raw question id -> the first raw skill of its set (-1 = none)."""
        return {q: skill_set[0] for q, skill_set in self.question_skills.items()}

    @property
    def max_skills(self) -> int:
        """The largest skill set of a question (>= 1)."""
        if self._max_skills is None:
            self._max_skills = max((len(skill_set) for skill_set in self.question_skills.values()), default=1)
        return self._max_skills

    # -- sizes --------------------------------------------------------------------------------
    @property
    def n_questions(self) -> int:
        """Rows of the question embedding: real questions + padding + unknown."""
        return len(self.questions) + FIRST_ID

    @property
    def n_skills(self) -> int:
        """Rows of the skill embedding: real skills + padding + unknown."""
        return len(self.skills) + FIRST_ID

    # -- building -----------------------------------------------------------------------------
    @classmethod
    def build(cls, inter: RawIds) -> Vocab:
        """Index every known question and skill of `inter` (deterministic: ascending raw id)."""
        q, sets = np.asarray(inter.question_id, dtype=np.int64), as_skill_sets(inter.skill_id)
        with_q = q != -1
        known = (sets >= 0).any(axis=1)
        # first occurrence of each question among rows with a known skill, then rows without one
        question_skills: dict[int, tuple[int, ...]] = {}
        for rows in (with_q & known, with_q & ~known):
            unique_questions, first = np.unique(q[rows], return_index=True)
            for raw_q, row in zip(unique_questions.tolist(), sets[rows][first]):
                question_skills.setdefault(raw_q, set_tuple(row))
        return cls(questions=_index(q), skills=_index(sets), question_skills=dict(sorted(question_skills.items())))

    # -- encoding -----------------------------------------------------------------------------
    def _table(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        if name not in self._tables:
            self._tables[name] = _lookup_table(getattr(self, name))
        return self._tables[name]

    def encode_questions(self, raw: np.ndarray) -> np.ndarray:
        """Raw question ids (any shape) -> model ids, int64; unknown ids and -1 -> UNK_ID."""
        return _encode(self._table("questions"), raw, UNK_ID)

    def encode_skills(self, raw: np.ndarray) -> np.ndarray:
        """Raw skill ids (any shape) -> model ids, int64; unknown ids and -1 -> UNK_ID."""
        return _encode(self._table("skills"), raw, UNK_ID)

    def skills_of_questions(self, raw_questions: np.ndarray) -> np.ndarray:
        """Raw question ids -> the first raw skill seen with each in training (-1 where unknown)."""
        return _encode(self._table("question_skill"), raw_questions, -1)

    def skill_sets_of_questions(self, raw_questions: np.ndarray) -> np.ndarray:
        """Raw question ids [N] -> the raw skill set seen with each in training, [N, max_skills]
        padded with NO_SKILL ([-1, NO_SKILL, ...] where the question is unknown)."""
        if self._sets is None:
            table = np.full((len(self.question_skills) + 1, self.max_skills), NO_SKILL, dtype=np.int64)
            table[-1, 0] = -1                                    # the row of unknown questions
            for i, skill_set in enumerate(self.question_skills.values()):
                table[i, :len(skill_set)] = skill_set
            self._sets = table
            self._tables["question_row"] = _lookup_table({q: i for i, q in enumerate(self.question_skills)})
        rows = _encode(self._tables["question_row"], raw_questions, len(self.question_skills))
        return self._sets[rows]

    def encode_skill_sets(self, raw: np.ndarray) -> np.ndarray:
        """Raw skill sets [..., K] -> model ids [..., K]: NO_SKILL -> PAD_ID, unknown and -1 -> UNK_ID."""
        raw = np.asarray(raw, dtype=np.int64)
        return np.where(raw == NO_SKILL, PAD_ID, self.encode_skills(raw)).astype(np.int64)

    # -- JSON ---------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "pad_id": PAD_ID,
            "unk_id": UNK_ID,
            "questions": {str(k): v for k, v in self.questions.items()},
            "skills": {str(k): v for k, v in self.skills.items()},
            "question_skills": {str(k): list(v) for k, v in self.question_skills.items()},
        }

    @classmethod
    def from_json(cls, d: Any, where: str = "vocab") -> Vocab:
        """Inverse of `to_json`; raises VocabError(`<where>: <problem>`) on anything malformed."""
        if not isinstance(d, dict):
            raise VocabError(f"{where}: expected a JSON object, got {type(d).__name__}")
        if d.get("format") not in (FORMAT, FORMAT_V1):
            raise VocabError(f"{where}: format is {d.get('format')!r}, expected {FORMAT!r}")
        for key, expected in (("pad_id", PAD_ID), ("unk_id", UNK_ID)):
            if d.get(key) != expected:
                raise VocabError(f"{where}: {key} is {d.get(key)!r}, this code uses {expected}")
        questions = _int_map(d, "questions", where)
        skills = _int_map(d, "skills", where)
        if d.get("format") == FORMAT_V1:
            question_skills = {q: (s,) for q, s in _int_map(d, "question_skill", where).items()}
        else:
            question_skills = _set_map(d, "question_skills", where)
        for name, mapping in (("questions", questions), ("skills", skills)):
            if any(raw < 0 for raw in mapping):
                raise VocabError(f"{where}: '{name}' has a negative raw id (-1 always means unknown)")
            if sorted(mapping.values()) != list(range(FIRST_ID, FIRST_ID + len(mapping))):
                raise VocabError(f"{where}: '{name}' ids must be exactly {FIRST_ID}..{FIRST_ID + len(mapping) - 1}, "
                                f"each once")
        return cls(questions=questions, skills=skills, question_skills=question_skills)

    def save(self, path: str | os.PathLike) -> None:
        """Write the vocab JSON atomically (routerkt/atomic.py)."""
        atomic_write_json(path, self.to_json(), indent=None)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Vocab:
        """Read a vocab JSON file; raises VocabError(`<path>: <problem>`) when missing or malformed."""
        d = read_json(path, VocabError)
        return cls.from_json(d, str(path))


def _int_map(d: dict, key: str, where: str) -> dict[int, int]:
    value = d.get(key)
    if not isinstance(value, dict):
        raise VocabError(f"{where}: '{key}' must be an object of raw id -> id")
    out: dict[int, int] = {}
    for k, v in value.items():
        try:
            raw = int(k)
        except ValueError:
            raise VocabError(f"{where}: '{key}' has a non-integer key {k!r}") from None
        if isinstance(v, bool) or not isinstance(v, int):
            raise VocabError(f"{where}: '{key}' maps {k!r} to {v!r}, expected an integer")
        out[raw] = v
    return out


def _set_map(d: dict, key: str, where: str) -> dict[int, tuple[int, ...]]:
    value = d.get(key)
    if not isinstance(value, dict):
        raise VocabError(f"{where}: '{key}' must be an object of raw question id -> list of raw skill ids")
    out: dict[int, tuple[int, ...]] = {}
    for k, v in value.items():
        try:
            raw = int(k)
        except ValueError:
            raise VocabError(f"{where}: '{key}' has a non-integer key {k!r}") from None
        if not isinstance(v, list) or not v or any(isinstance(s, bool) or not isinstance(s, int) for s in v):
            raise VocabError(f"{where}: '{key}' maps {k!r} to {v!r}, expected a non-empty list of integers")
        out[raw] = tuple(v)
    return out
