"""The evaluation protocol: interactions -> fixed-window sequences, and learner folds.

Sequences (`make_sequences`):
- `recent` (the paper's): learners with >= min_interactions interactions; one sequence per learner
  holding their most recent `window` interactions.
- `chunks`: each kept learner's whole history cut into consecutive, non-overlapping `window`-long
  pieces from the oldest interaction on; the last, partial piece is kept only if it has
  >= min_interactions rows.
- `whole`: one sequence per kept learner holding its whole history; the arrays are as wide as the
  longest history (band models: `window` is their band, not a cut).

Padding is on the LEFT everywhere (training, offline evaluation and serving): the most recent
interaction of a sequence sits at index W-1, padding fills indices 0 .. W-len-1 with
questions = PAD_ID (0), every skill slot PAD_ID and responses = -1. Skills are sets: [S, W, K] with
K the largest set of the interactions (1 for single-skill data), unused slots PAD_ID.

Folds are over learners, never over sequences, so all chunks of a learner land in the same part:
- `make_folds(ids, K, valid_ratio, seed)`: the distinct learner ids are sorted, then shuffled with
  `np.random.default_rng(seed)` and cut into K near-equal test parts (the first parts get the extra
  learner, as `np.array_split` does). For fold k the remaining learners are shuffled with
  `np.random.default_rng(seed + k)` and the last ceil(valid_ratio * n) become validation.
  K = 1 means one split: the first 20% of the shuffled learners (at least one) are the test set.
- `load_folds_file(path, ids, ...)`: test learners given by another tool's split file (see its doc);
  validation is drawn from the rest exactly as above.
All arrays of a Fold are sorted ascending.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from routerkt.contract.signature import PAD_ID, PAD_RESPONSE
from routerkt.errors import UserError
from training.config import Protocol
from training.data.csv_reader import DataError, Interactions
from routerkt.contract.vocab import Vocab

log = logging.getLogger(__name__)

SINGLE_SPLIT_TEST_RATIO = 0.2  # test share when n_folds == 1



@dataclass
class Sequences:
    """S left-padded sequences of window W (index W-1 = most recent interaction)."""

    questions: np.ndarray  # int64 [S, W] model question ids, PAD_ID in padding
    skills: np.ndarray     # int64 [S, W, K] model skill ids of each set, PAD_ID in unused slots and padding
    responses: np.ndarray  # int64 [S, W] 0/1, -1 in padding
    lengths: np.ndarray    # int64 [S] real interactions per sequence (1..W)
    learners: np.ndarray   # int64 [S] raw user id of each sequence

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def window(self) -> int:
        return int(self.questions.shape[1])

    @property
    def max_skills(self) -> int:
        """K: skill slots per interaction."""
        return int(self.skills.shape[2])

    @property
    def n_interactions(self) -> int:
        return int(self.lengths.sum())

    def subset(self, index: np.ndarray) -> Sequences:
        """The sequences picked by a boolean mask [S] or an integer index array."""
        index = np.asarray(index)
        return Sequences(questions=self.questions[index], skills=self.skills[index],
                         responses=self.responses[index], lengths=self.lengths[index],
                         learners=self.learners[index])

    def select_learners(self, ids: np.ndarray) -> Sequences:
        """All sequences of the given raw learner ids (in their current order)."""
        return self.subset(np.isin(self.learners, np.asarray(ids, dtype=np.int64)))


def _check_window(window: int, min_interactions: int) -> None:
    if window < 1:
        raise UserError(f"window must be >= 1, got {window}")
    if min_interactions < 1:
        raise UserError(f"min_interactions must be >= 1, got {min_interactions}")


def _pieces(protocol: Protocol, starts: np.ndarray, lengths: np.ndarray, window: int,
            min_interactions: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(learner index, first row, length) of every sequence, for learners already filtered."""
    if protocol is Protocol.WHOLE:
        return np.arange(lengths.shape[0]), starts, lengths
    if protocol is Protocol.RECENT:
        take = np.minimum(lengths, window)
        return np.arange(lengths.shape[0]), starts + lengths - take, take
    # chunks: piece j of a learner covers rows [start + j*W, start + min((j+1)*W, n))
    n_pieces = -(-lengths // window)
    owner = np.repeat(np.arange(lengths.shape[0]), n_pieces)
    first_piece = np.cumsum(n_pieces) - n_pieces
    j = np.arange(owner.shape[0]) - first_piece[owner]
    piece_start = starts[owner] + j * window
    piece_len = np.minimum(window, lengths[owner] - j * window)
    keep = (piece_len == window) | (piece_len >= min_interactions)
    return owner[keep], piece_start[keep], piece_len[keep]


def make_sequences(inter: Interactions, vocab: Vocab, protocol: Protocol | str, window: int,
                   min_interactions: int) -> Sequences:
    """Cut `inter` into left-padded windows by `protocol` (see the module docstring)."""
    protocol = Protocol(protocol)
    _check_window(window, min_interactions)
    users, starts, lengths = inter.segments()
    kept = lengths >= min_interactions
    users, starts, lengths = users[kept], starts[kept], lengths[kept]
    owner, first, length = _pieces(protocol, starts, lengths, window, min_interactions)
    if protocol is Protocol.WHOLE:
        window = max(int(length.max()) if length.size else 1, 1)

    # rows[s, t] = row of the interaction at window position t; valid where t >= W - length
    offset = np.arange(window)[None, :] - (window - length)[:, None]       # [S, W]
    valid = offset >= 0
    rows = np.where(valid, first[:, None] + offset, 0)                      # [S, W]
    q_ids = vocab.encode_questions(inter.question_id)
    s_ids = vocab.encode_skill_sets(inter.skill_id)                        # [N, K]
    return Sequences(
        questions=np.where(valid, q_ids[rows], PAD_ID).astype(np.int64),
        skills=np.where(valid[:, :, None], s_ids[rows], PAD_ID).astype(np.int64),
        responses=np.where(valid, inter.correct[rows], PAD_RESPONSE).astype(np.int64),
        lengths=length.astype(np.int64),
        learners=users[owner].astype(np.int64),
    )


# ----------------------------------------------------------------------------------------------
# Folds

@dataclass
class Fold:
    """One cross-validation fold: disjoint raw learner ids that together cover every learner."""

    index: int
    train: np.ndarray  # int64, sorted
    valid: np.ndarray  # int64, sorted
    test: np.ndarray   # int64, sorted


def _n_valid(valid_ratio: float, n: int) -> int:
    return math.ceil(round(valid_ratio * n, 9))  # round: 0.1 * 30 must give 3, not 4


def _split_rest(index: int, test: np.ndarray, rest: np.ndarray, valid_ratio: float, seed: int) -> Fold:
    rest = np.random.default_rng(seed + index).permutation(np.sort(rest))
    n_valid = _n_valid(valid_ratio, rest.shape[0])
    train, valid = rest[:rest.shape[0] - n_valid], rest[rest.shape[0] - n_valid:]
    if train.size == 0 or test.size == 0 or (valid_ratio > 0 and valid.size == 0):
        raise UserError(f"fold {index}: too few learners ({train.size} train, {valid.size} valid, "
                        f"{test.size} test); lower the number of folds or use more data")
    return Fold(index=index, train=np.sort(train), valid=np.sort(valid), test=np.sort(test))


def _check_fold_args(n_folds: int, valid_ratio: float) -> None:
    if n_folds < 1:
        raise UserError(f"folds must be >= 1, got {n_folds}")
    if not 0 <= valid_ratio < 1:
        raise UserError(f"valid_ratio must be in [0, 1), got {valid_ratio}")


def make_folds(learner_ids: np.ndarray, n_folds: int, valid_ratio: float, seed: int) -> list[Fold]:
    """K-fold split over learners (see the module docstring); deterministic for a given seed."""
    _check_fold_args(n_folds, valid_ratio)
    ids = np.unique(np.asarray(learner_ids, dtype=np.int64))
    need = max(n_folds, 2) + (1 if valid_ratio > 0 else 0)
    if ids.size < need:
        raise UserError(f"{ids.size} learner(s) are too few for {n_folds} fold(s) with validation "
                        f"ratio {valid_ratio}; need at least {need}")
    shuffled = np.random.default_rng(seed).permutation(ids)
    if n_folds == 1:
        n_test = max(1, round(SINGLE_SPLIT_TEST_RATIO * ids.size))
        tests = [shuffled[:n_test]]
    else:
        tests = np.array_split(shuffled, n_folds)
    return [_split_rest(k, test, np.setdiff1d(ids, test), valid_ratio, seed) for k, test in enumerate(tests)]


# ----------------------------------------------------------------------------------------------
# Split files written by other tools

def _natural_key(name: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def _is_train_only(name: str) -> bool:
    return name.lower().startswith("train")


def _parse_ids(values: Any, where: str, what: str) -> list[int]:
    out = []
    for v in values:
        try:
            if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
                raise ValueError
            out.append(int(v))
        except (TypeError, ValueError):
            raise DataError(f"{where}: {what} holds {v!r}, expected integer learner ids") from None
    return out


def read_folds_file(path: str | os.PathLike) -> dict[str, list[int]]:
    """Test learners per fold name, in fold order, from either layout:

    - `{"<fold>": [user ids, ...], ...}` - each fold's TEST learners (keys starting with "train" are
      training-only learners and name no fold);
    - `{"<user id>": "<split name>", ...}` - the layout of shared/datasets/*/splits.json: each split
      name except those starting with "train" (e.g. "train", "train_only") is one fold's test set
      ("fold1".."fold5" -> five folds; "test" -> a single fold).
    Folds come in natural name order (fold2 before fold10). A learner in two test sets is an error.
    """
    where = str(path)
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{where}: no such file") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}:{exc.lineno}: invalid JSON ({exc.msg}, column {exc.colno})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{where}: cannot read ({exc})") from None
    if not isinstance(d, dict) or not d:
        raise DataError(f"{where}: expected a non-empty JSON object of fold -> [learner ids] "
                        f"or learner id -> split name")
    groups: dict[str, list[int]] = {}
    if all(isinstance(v, list) for v in d.values()):
        for name, ids in d.items():
            if not _is_train_only(name):
                groups[name] = _parse_ids(ids, where, f"fold {name!r}")
    elif all(isinstance(v, str) for v in d.values()):
        users = _parse_ids(d.keys(), where, "a key")
        for user, name in zip(users, d.values()):
            if not _is_train_only(name):
                groups.setdefault(name, []).append(user)
    else:
        raise DataError(f"{where}: values must be all lists (fold -> [learner ids]) "
                        f"or all strings (learner id -> split name)")
    if not groups:
        raise DataError(f"{where}: names no test learners (every split starts with 'train')")
    seen: dict[int, str] = {}
    for name, ids in groups.items():
        for user in ids:
            if user in seen and seen[user] != name:
                raise DataError(f"{where}: folds {seen[user]!r} and {name!r} overlap "
                                f"(a learner is in both test sets)")
            seen[user] = name
    return {name: groups[name] for name in sorted(groups, key=_natural_key)}


def load_folds_file(path: str | os.PathLike, learner_ids: np.ndarray, valid_ratio: float = 0.1,
                    seed: int = 12405) -> list[Fold]:
    """Folds whose test learners come from a split file (`read_folds_file`), restricted to `learner_ids`.

    Learners of the file that are not in `learner_ids` (e.g. dropped for being too short) are
    ignored and counted in a warning; learners the file does not place in any test set are always
    training learners. Validation comes from each fold's remaining learners, shuffled with seed + k.
    """
    if not 0 <= valid_ratio < 1:
        raise UserError(f"valid_ratio must be in [0, 1), got {valid_ratio}")
    groups = read_folds_file(path)
    ids = np.unique(np.asarray(learner_ids, dtype=np.int64))
    listed = np.unique(np.fromiter((u for g in groups.values() for u in g), dtype=np.int64))
    unknown = int(np.setdiff1d(listed, ids).size)
    if unknown:
        log.warning("%s: %d learner(s) of the folds file are not in the data and are ignored", path, unknown)
    folds = []
    for k, (name, members) in enumerate(groups.items()):
        test = np.intersect1d(np.asarray(members, dtype=np.int64), ids)
        if test.size == 0:
            raise DataError(f"{path}: fold {name!r} has no test learner in the data")
        folds.append(_split_rest(k, test, np.setdiff1d(ids, test), valid_ratio, seed))
    return folds
