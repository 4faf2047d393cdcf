"""The session store interface: per-learner, append-only, ordered event logs with idempotent
appends, bounded retention and an optional TTL for inactive learners (`expire`).

Both implementations (sqlite_store.py, redis_store.py) promise the same:
- `append` is all or nothing and returns only once the events are durable (SQLite: committed with
  synchronous=FULL in WAL mode; Redis: run by the server, whose AOF `appendfsync always` we start
  it with). Events whose event key is already stored for the learner are skipped (counted as
  duplicates); the rest are appended in request order, after everything stored before.
- Retention: after an append only the newest `keep` events of the learner are kept; idempotency
  holds for the event keys still kept.
- `forget` removes everything stored for the learner.
- A store that cannot be reached raises StoreUnavailable (the caller answers UNAVAILABLE).

Served predictions (outcome tracking, serving/outcomes/): `remember_served` keeps what the gateway
served to an owner (a learner key, or "p" + a prediction id) per question, model and version until
`expires_ms`; a newer prediction of the same question by the same version replaces the older one.
`take_served` returns and deletes the unexpired entries of some questions (each is joined with an
answer at most once); `sweep_served` deletes the expired ones. These are a bounded cache, not a
log: SQLite keeps them in a file of their own written without fsync, so a crash may lose the last
moments of it, never a stored event. `forget` deletes them too.

Implementations are chosen by URL in serving/sessions/factory.py (`open_store`); this interface
imports none of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Protocol

import numpy as np

from routerkt.contract.signature import NO_SKILL
from serving.core.revision import Revision


NO_TIMESTAMP = -1


class StoreUnavailable(Exception):
    """The store did not answer (down, unreachable, timed out); str() is for the log only."""

    # True when a server answered but refused the credentials (redis_store.CredentialsRefused): waiting
    # does not fix that, so `routerkt serve` refuses to start (serving/cli/cli_serve.py)
    credentials_refused: bool = False


@dataclass(frozen=True)
class StoredEvent:
    event_key: str           # keyed hash of the client's event id (serving/sessions/keys.py)
    question_id: int
    skills: tuple[int, ...]  # the event's raw skill set; () when it had none (one int: a set of one,
                             # NO_SKILL (-2): none)
    correct: int
    timestamp_ms: int = NO_TIMESTAMP

    def __post_init__(self) -> None:
        if isinstance(self.skills, int):
            object.__setattr__(self, "skills", () if self.skills == NO_SKILL else (self.skills,))

    @property
    def first_skill(self) -> int:
        """The set's first skill, NO_SKILL for none (what a one-skill column holds)."""
        return self.skills[0] if self.skills else NO_SKILL

    @property
    def skill_text(self) -> str:
        """The set as text, "3;17" (one skill: "3"; none: "-2"), as Redis keeps it."""
        return ";".join(map(str, self.skills)) if self.skills else str(NO_SKILL)


@dataclass(frozen=True)
class AppendResult:
    stored: int
    duplicates: int
    history_length: int      # events held for the learner after the append
    new: tuple[bool, ...] = ()   # per request event: stored by this append (False: a duplicate)
    revision: Revision | None = None   # the learner's log after the append


@dataclass(frozen=True)
class ServedEntry:
    """One probability the gateway served: for `owner`'s candidate `question`, by model/version."""

    owner: str
    question_id: int
    model: str
    version: int
    probability: float


@dataclass
class History:
    """A learner's stored events, oldest first."""

    questions: np.ndarray    # int64 [n]
    skills: np.ndarray       # int64 [n, K] raw skill sets (serving/core/calls.py: NO_SKILL padding; a row
                             # starting with NO_SKILL had none: looked up from the question)
    correct: np.ndarray      # int64 [n]
    revision: Revision | None = None   # the whole log's, read with these events (None: no events)

    @classmethod
    def empty(cls) -> History:
        return cls(np.zeros(0, dtype=np.int64), np.zeros((0, 1), dtype=np.int64), np.zeros(0, dtype=np.int64))

    @classmethod
    def from_rows(cls, rows: list[tuple[int, int, int]], sets: dict[int, tuple[int, ...]] | None = None,
                  revision: Revision | None = None) -> History:
        """`rows` (question, first skill or NO_SKILL, correct) oldest first; `sets`: row index -> the
        whole set, for the rows whose set has more than one skill; `revision`: the log's, read with them."""
        if not rows:
            return cls.empty()
        array = np.asarray(rows, dtype=np.int64)
        skills = array[:, 1:2].copy()
        if sets:
            width = max(len(s) for s in sets.values())
            skills = np.concatenate([skills, np.full((len(rows), width - 1), NO_SKILL, dtype=np.int64)], axis=1)
            for index, skill_set in sets.items():
                skills[index, :len(skill_set)] = skill_set
        return cls(array[:, 0].copy(), skills, array[:, 2].copy(), revision)

    def last(self, n: int) -> History:
        """The newest `n` events (n <= len), same revision."""
        start = self.questions.shape[0] - n
        return History(self.questions[start:], self.skills[start:], self.correct[start:], self.revision)

    @classmethod
    def of_events(cls, events: list[StoredEvent]) -> History:
        """The events as a store reads them back, oldest first."""
        return cls.from_rows([(e.question_id, e.first_skill, e.correct) for e in events],
                             {i: e.skills for i, e in enumerate(events) if len(e.skills) > 1})


def parse_skills(text: str) -> tuple[int, ...]:
    """StoredEvent.skill_text -> the set."""
    skills = tuple(int(s) for s in text.split(";"))
    return () if skills == (NO_SKILL,) else skills


class SessionStore(Protocol):
    kind: str                # "sqlite" | "redis": for logs, metrics and /readyz

    @property
    def path(self) -> Path | None:
        """The file the store keeps its events in (SQLite); None for a server (Redis)."""

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def ping(self) -> None:
        """Raise StoreUnavailable unless the store answers."""

    async def append(self, learner_key: str, events: list[StoredEvent], keep: int, now_ms: int) -> AppendResult: ...

    async def append_many(self, batch: list[tuple[str, list[StoredEvent]]], keep: int,
                          now_ms: int) -> list[AppendResult]:
        """Appends of several learners at once (bulk import); each keeps `append`'s guarantees."""

    async def history(self, learner_key: str, limit: int) -> History:
        """The newest `limit` events, oldest first (empty for an unknown learner), with the log's revision
        read in the same snapshot (serving/core/revision.py: a new learner's log starts at a random base)."""

    async def forget(self, learner_key: str) -> tuple[bool, int]:
        """(whether anything was stored, events deleted)."""

    async def expire(self, now_ms: int) -> int:
        """Delete the learners inactive for longer than the store's TTL; how many were (0 without a
        TTL, or where the store's keys expire by themselves, as Redis's do). SessionService runs it."""

    async def learner_keys(self) -> list[str]:
        """Every learner key held (for audits and tests; scans the whole store)."""

    def stream(self, chunk_learners: int) -> AsyncIterator[list[tuple[str, list[StoredEvent]]]]:
        """Every learner's stored events, oldest first, in chunks of at most `chunk_learners` learners,
        each learner once; memory holds one chunk (`routerkt sessions export`). Event keys are not
        read (""). A learner forgotten before its chunk is read does not appear."""

    async def remember_served(self, entries: list[ServedEntry], expires_ms: int) -> None: ...

    async def take_served(self, owner: str, questions: list[int], now_ms: int) -> list[ServedEntry]:
        """The unexpired entries of `owner` for `questions`, deleted from the store."""

    async def sweep_served(self, now_ms: int) -> int:
        """Delete the expired served entries; how many were (0 where they expire by themselves, as
        Redis's keys do). The outcome tracker runs it."""
