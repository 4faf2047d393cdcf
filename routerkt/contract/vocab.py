"""The vocabulary: raw question / skill ids of a data set -> the model's embedding ids.

Conventions (routerkt/contract/signature.py): PAD_ID = 0 (padding), UNK_ID = 1 (unknown id, and every raw -1),
real ids from FIRST_ID = 2 in ascending order of the raw id, so building twice from the same data
gives the same mapping. `question_skill` keeps, for each raw question, the raw skill of its first
occurrence with a known skill (-1 if it never had one); the gateway uses it when a request names a
question without its skill.

The vocabulary travels with a model into the Triton repository as `vocab.json`:

    {"format": "routerkt-vocab/1", "pad_id": 0, "unk_id": 1,
     "questions": {"<raw>": id, ...}, "skills": {"<raw>": id, ...},
     "question_skill": {"<raw question>": raw_skill, ...}}

No torch and no training code here: export writes this file, the serving gateway reads it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from typing import Protocol

from routerkt.atomic import atomic_write_json
from routerkt.contract.json_file import read_json
from routerkt.contract.signature import FIRST_ID, PAD_ID, UNK_ID
from routerkt.errors import UserError

FORMAT = "routerkt-vocab/1"


class VocabError(UserError):
    """A vocabulary file or object is missing or malformed; str(error) is `<where>: <problem>`."""


class RawIds(Protocol):
    """What `Vocab.build` reads: raw question and skill ids, one per interaction (-1 = unknown)."""

    question_id: np.ndarray
    skill_id: np.ndarray


def _index(raw_ids: np.ndarray) -> dict[int, int]:
    """Distinct known raw ids (not -1), ascending -> FIRST_ID, FIRST_ID + 1, ..."""
    known = np.unique(raw_ids[raw_ids != -1])
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


@dataclass
class Vocab:
    """Raw id -> model id for questions and skills, and raw question -> raw skill."""

    questions: dict[int, int]       # raw question id -> model id (>= FIRST_ID)
    skills: dict[int, int]          # raw skill id -> model id (>= FIRST_ID)
    question_skill: dict[int, int]  # raw question id -> raw skill id of its first occurrence (-1 = none)
    _tables: dict[str, tuple[np.ndarray, np.ndarray]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

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
        q, s = inter.question_id, inter.skill_id
        with_q = q != -1
        # first occurrence of each question among rows with a known skill, then rows without one
        qs: dict[int, int] = {}
        for rows in (with_q & (s != -1), with_q & (s == -1)):
            uq, first = np.unique(q[rows], return_index=True)
            skills_here = s[rows][first]
            for raw_q, raw_s in zip(uq.tolist(), skills_here.tolist()):
                qs.setdefault(raw_q, raw_s)
        return cls(questions=_index(q), skills=_index(s), question_skill=dict(sorted(qs.items())))

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
        """Raw question ids -> the raw skill seen with each in training (-1 where unknown)."""
        return _encode(self._table("question_skill"), raw_questions, -1)

    # -- JSON ---------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "pad_id": PAD_ID,
            "unk_id": UNK_ID,
            "questions": {str(k): v for k, v in self.questions.items()},
            "skills": {str(k): v for k, v in self.skills.items()},
            "question_skill": {str(k): v for k, v in self.question_skill.items()},
        }

    @classmethod
    def from_json(cls, d: Any, where: str = "vocab") -> Vocab:
        """Inverse of `to_json`; raises VocabError(`<where>: <problem>`) on anything malformed."""
        if not isinstance(d, dict):
            raise VocabError(f"{where}: expected a JSON object, got {type(d).__name__}")
        if d.get("format") != FORMAT:
            raise VocabError(f"{where}: format is {d.get('format')!r}, expected {FORMAT!r}")
        for key, expected in (("pad_id", PAD_ID), ("unk_id", UNK_ID)):
            if d.get(key) != expected:
                raise VocabError(f"{where}: {key} is {d.get(key)!r}, this code uses {expected}")
        questions = _int_map(d, "questions", where)
        skills = _int_map(d, "skills", where)
        question_skill = _int_map(d, "question_skill", where)
        for name, mapping in (("questions", questions), ("skills", skills)):
            if any(raw < 0 for raw in mapping):
                raise VocabError(f"{where}: '{name}' has a negative raw id (-1 always means unknown)")
            if sorted(mapping.values()) != list(range(FIRST_ID, FIRST_ID + len(mapping))):
                raise VocabError(f"{where}: '{name}' ids must be exactly {FIRST_ID}..{FIRST_ID + len(mapping) - 1}, "
                                f"each once")
        return cls(questions=questions, skills=skills, question_skill=question_skill)

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
