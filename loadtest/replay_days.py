"""A canonical dataset replayed as simulated days: which learner answers what, on which day, when.

    learners = read_learners(path, cap=400, seed=0)          # a seeded sample of the file's learners
    days = schedule(learners, days=10, per_day=12, seed=0)   # days[0]: before the replay (trains v1)
    write_canonical(days[0], path)                           # what `routerkt train` reads

The canonical CSV has no clock, only each learner's order, so time is simulated: every learner
answers its next `per_day` interactions (in the file's order) each day, starting on day 0, until it
has none left. A learner's answers of one day start at a seeded time of that day (08:00-20:00 UTC)
and follow each other a minute apart; day d starts at START_MS + d x 24 h. Rows of one multi-skill
interaction written one per skill are merged as training merges them (training/data/skill_rows.py),
so a replayed answer never repeats the row before it.
"""
from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from routerkt.contract.signature import NO_SKILL
from routerkt.errors import UserError

START_MS = 1_767_225_600_000          # 2026-01-01T00:00:00Z: day 0 of the replay
DAY_MS = 86_400_000
GAP_MS = 60_000                       # between two answers of one learner
FIRST_HOUR, LAST_HOUR = 8, 20         # a learner's day starts in [08:00, 20:00)


@dataclass(frozen=True)
class Answer:
    learner: str                      # learner_id sent to the gateway
    user_id: int                      # the file's user_id
    order: int                        # the learner's interaction number (0, 1, ...)
    question: int
    skills: tuple[int, ...]           # the skill set (-1: unknown)
    correct: int
    timestamp_ms: int

    @property
    def event_id(self) -> str:
        return f"{self.user_id}-{self.order}"


@dataclass
class Learner:
    user_id: int
    questions: np.ndarray             # int64 [n]
    skills: list[tuple[int, ...]]     # n skill sets
    correct: np.ndarray               # int8 [n]

    @property
    def learner_id(self) -> str:
        return f"learner-{self.user_id}"


def resolve_data(path: Path) -> Path:
    """The canonical CSV of `path`: the file itself, or a dataset folder's interactions.csv(.gz)
    (the shared datasets' layout), or its only *.csv / *.csv.gz."""
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise UserError(f"--data {path}: no such file or folder")
    for name in ("interactions.csv.gz", "interactions.csv"):
        if (path / name).is_file():
            return path / name
    found = sorted([*path.glob("*.csv"), *path.glob("*.csv.gz")])
    if len(found) != 1:
        raise UserError(f"--data {path}: expected interactions.csv(.gz) or one *.csv(.gz) in the folder, found "
                        f"{len(found)}")
    return found[0]


def read_learners(path: Path, cap: int | None, seed: int) -> list[Learner]:
    """The learners of the canonical CSV at `path` (multi-skill rows merged); at most `cap` of them,
    a sample drawn with `seed`, in the file's order."""
    from training.data.csv_reader import read_interactions
    from training.data.skill_rows import merge_rows
    inter = merge_rows(read_interactions(resolve_data(path)))
    slices = inter.learner_slices()
    if cap is not None and cap < len(slices):
        picked = np.sort(np.random.default_rng(seed).choice(len(slices), size=cap, replace=False))
        slices = [slices[i] for i in picked]
    learners = []
    for user, rows in slices:
        sets = inter.skill_id[rows]
        learners.append(Learner(user, inter.question_id[rows].astype(np.int64),
                                [tuple(int(s) for s in row if s != NO_SKILL) for row in sets],
                                inter.correct[rows].astype(np.int8)))
    return learners


def schedule(learners: list[Learner], days: int, per_day: int, seed: int) -> list[list[list[Answer]]]:
    """days + 1 lists (day 0, the one before the replay, then days 1..days), each a list of the
    learners' answers of that day (one list per learner active that day, in its order)."""
    if days < 1 or per_day < 1:
        raise UserError("--days and --per-day must be >= 1")
    rng = np.random.default_rng(seed + 1)
    out: list[list[list[Answer]]] = [[] for _ in range(days + 1)]
    for learner in learners:
        for day in range(days + 1):
            first = day * per_day
            if first >= len(learner.questions):
                break
            start = START_MS + day * DAY_MS + int(rng.integers(FIRST_HOUR * 3_600_000, LAST_HOUR * 3_600_000))
            out[day].append([Answer(learner.learner_id, learner.user_id, t, int(learner.questions[t]),
                                    learner.skills[t], int(learner.correct[t]), start + (t - first) * GAP_MS)
                             for t in range(first, min(first + per_day, len(learner.questions)))])
    return out


def write_canonical(day: list[list[Answer]], path: Path) -> int:
    """The answers as a canonical CSV (`user_id,order,question_id,skill_id,correct,timestamp_ms`, a skill
    set as `3;17`); returns the rows written."""
    rows = 0
    tmp = Path(f"{path}.tmp-{os.getpid()}")
    with open(tmp, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["user_id", "order", "question_id", "skill_id", "correct", "timestamp_ms"])
        for answers in day:
            for a in answers:
                writer.writerow([a.user_id, a.order, a.question, ";".join(map(str, a.skills)) or "-1", a.correct,
                                 a.timestamp_ms])
                rows += 1
    os.replace(tmp, path)
    return rows
