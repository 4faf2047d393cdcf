"""The retrain's data: the exported events split forward in time, and the grown vocabulary.

The rows before the cutoff are trained on; each learner's from its first event at or after the cutoff
are held out."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from routerkt.contract.signature import FIRST_ID
from routerkt.contract.vocab import Vocab
from routerkt.errors import UserError
from routerkt.timestamps import format_time

TRAIN_SHARE = 0.8          # default cutoff: the time before which this share of the timed events lies
MIN_TRAIN_EVENTS = 500     # fewer events before the cutoff: "too few events for the split"
MIN_HELDOUT_EVENTS = 100   # fewer after it (or one class only): the same
MIN_TRAIN_LEARNERS = 10


@dataclass
class Split:
    """Every learner's events in store order, the training rows, and which rows are held out."""

    user_id: np.ndarray       # int64 [N] (rows grouped by learner, in store order)
    question_id: np.ndarray   # int64 [N]
    skill_id: np.ndarray      # int64 [N, K] raw sets, NO_SKILL padding, -1 unknown
    correct: np.ndarray       # int64 [N]
    heldout: np.ndarray       # bool [N]: at or after the learner's first event at/after the cutoff
    cutoff_ms: int
    train_csv: Path
    timed: bool = True        # False: no event has a timestamp; cutoff_ms is a place in each learner's log

    @property
    def cutoff_text(self) -> str:
        if not self.timed:
            return f"each learner's last {1 - TRAIN_SHARE:.0%} of events (no event has a timestamp)"
        return format_time(self.cutoff_ms)

    @property
    def sizes(self) -> dict[str, int]:
        learners = np.unique(self.user_id)
        return {"events": int(self.user_id.size), "learners": int(learners.size),
                "train_events": int((~self.heldout).sum()), "heldout_events": int(self.heldout.sum()),
                "train_learners": int(np.unique(self.user_id[~self.heldout]).size),
                "heldout_learners": int(np.unique(self.user_id[self.heldout]).size)}

    def segments(self) -> list[tuple[int, int, int]]:
        """(start, first held-out row, end) of each learner with held-out rows."""
        bounds = np.flatnonzero(np.diff(self.user_id)) + 1
        starts, ends = np.concatenate([[0], bounds]), np.concatenate([bounds, [self.user_id.size]])
        out = []
        for start, end in zip(starts.tolist(), ends.tolist()):
            held = np.flatnonzero(self.heldout[start:end])
            if held.size:
                out.append((start, start + int(held[0]), end))
        return out


def filled_timestamps(user_id: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """Events without a timestamp (-1) take their learner's previous stamped one (-1 when none yet)."""
    ts = ts.astype(np.int64).copy()
    first = np.concatenate([[True], user_id[1:] != user_id[:-1]])
    for i in np.flatnonzero(ts < 0):
        if not first[i]:
            ts[i] = ts[i - 1]
    return ts


POSITION_SCALE = 1_000_000


def _positions(user_id: np.ndarray) -> np.ndarray:
    """Each event's place in its learner's log, scaled to [0, POSITION_SCALE): the split without timestamps
    holds out the last (1 - TRAIN_SHARE) of every learner's events (cutoff -1 in the report)."""
    starts = np.flatnonzero(np.concatenate([[True], user_id[1:] != user_id[:-1]]))
    lengths = np.diff(np.concatenate([starts, [user_id.size]]))
    index = np.arange(user_id.size) - np.repeat(starts, lengths)
    return (index * POSITION_SCALE // np.repeat(lengths, lengths)).astype(np.int64)


def default_cutoff(ts: np.ndarray, share: float = TRAIN_SHARE) -> int:
    """The time before which `share` of the timed events lie (the first held-out time)."""
    timed = np.sort(ts[ts >= 0])
    if timed.size == 0:
        raise UserError("too few events for the split: no stored event has a timestamp (Observe's timestamp_ms)")
    return int(timed[min(int(share * timed.size), timed.size - 1)])


def split_events(events_csv: Path, train_csv: Path, cutoff_ms: int | None) -> Split:
    """Read the export, split each learner at the cutoff, write the training rows as a canonical CSV."""
    import pandas as pd
    from training.data.csv_reader import read_interactions
    with open(events_csv, "rb") as handle:
        if len(handle.read(4096).splitlines()) < 2:
            raise UserError("the store holds no events: nothing to retrain on")
    inter = read_interactions(events_csv)
    frame = pd.read_csv(events_csv, dtype={"skill_id": str})
    ts = filled_timestamps(inter.user_id, frame["timestamp_ms"].to_numpy(np.int64))
    timed = True
    if cutoff_ms is None and not (ts >= 0).any():        # no timestamps at all (a backlog imported without them)
        ts, cutoff_ms, timed = _positions(inter.user_id), int(TRAIN_SHARE * POSITION_SCALE), False
    cutoff = default_cutoff(ts) if cutoff_ms is None else int(cutoff_ms)
    after = ts >= cutoff
    # held out: from each learner's first event at or after the cutoff on (store order, not clock order)
    starts = np.concatenate([[True], inter.user_id[1:] != inter.user_id[:-1]])
    group = np.cumsum(starts) - 1
    seen = np.maximum.accumulate(np.where(after, np.arange(after.size), -1))
    group_start = np.flatnonzero(starts)[group]
    heldout = seen >= group_start
    split = Split(inter.user_id, inter.question_id, inter.skill_id, inter.correct.astype(np.int64), heldout,
                  cutoff, train_csv, timed)
    sizes = split.sizes
    if sizes["train_events"] < MIN_TRAIN_EVENTS or sizes["train_learners"] < MIN_TRAIN_LEARNERS:
        raise UserError(f"too few events for the split: {sizes['train_events']} events of {sizes['train_learners']} "
                        f"learners before the cutoff {split.cutoff_text} "
                        f"(need {MIN_TRAIN_EVENTS} of {MIN_TRAIN_LEARNERS})")
    labels = split.correct[heldout]
    if labels.size < MIN_HELDOUT_EVENTS or labels.min() == labels.max():
        raise UserError(f"too few events for the split: {labels.size} held-out events after the cutoff "
                        f"{split.cutoff_text} (need {MIN_HELDOUT_EVENTS}, both answers present); "
                        "choose another --cutoff")
    frame[~heldout].to_csv(train_csv, index=False, columns=["user_id", "order", "question_id", "skill_id", "correct"])
    return split


def grown_vocab(base: Vocab, data: Vocab) -> tuple[Vocab, dict[str, int]]:
    """The base version's vocabulary (loop/retrain/base_version.py) plus the questions and skills the platform
    added since (ids by ascending raw id, as Vocab.build); a question keeps the base version's skill set.
    Returns (vocab, counts): the new ids are those `base` does not know."""
    questions = sorted(set(base.questions) | set(data.questions))
    skills = sorted(set(base.skills) | set(data.skills))
    vocab = Vocab(questions={q: FIRST_ID + i for i, q in enumerate(questions)},
                  skills={s: FIRST_ID + i for i, s in enumerate(skills)},
                  question_skills=dict(sorted({**data.question_skills, **base.question_skills}.items())))
    return vocab, {"new_questions": len(set(data.questions) - set(base.questions)),
                   "new_skills": len(set(data.skills) - set(base.skills)),
                   "questions": len(questions), "skills": len(skills)}
