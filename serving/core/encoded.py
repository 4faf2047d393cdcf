"""What an Encoder (serving/pipeline/parts.py) produces: a learner in model ids, one backend call's inputs,
and the step graphs' feeds it builds for the learner-state path (StepFeeds)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass
class EncodedLearner:
    """One learner in model ids, history already truncated to the window."""

    questions: np.ndarray            # int64 [n] used history, oldest first
    skills: np.ndarray               # int64 [n, K] model skill ids, PAD_ID in unused slots
    responses: np.ndarray            # int64 [n], 0/1
    candidate_questions: np.ndarray  # int64 [C]
    candidate_skills: np.ndarray     # int64 [C, K'] as skills

    @property
    def width(self) -> int:
        """The widest skill set of the learner (history or candidates)."""
        return max(self.skills.shape[1], self.candidate_skills.shape[1])

    @property
    def history_used(self) -> int:
        return int(self.questions.shape[0])

    @property
    def n_candidates(self) -> int:
        return int(self.candidate_questions.shape[0])


@dataclass
class Inference:
    """One backend call: the graph's inputs for some of a call's learners, and how to read them back."""

    learners: list[int]                  # indices into the call's learners
    feeds: dict[str, np.ndarray]         # the graph's inputs, int64
    reads: list[tuple[int, int]]         # per learner: (row, candidates) for rank, (first row, rows) for score
    rank: bool

    def split(self, output: np.ndarray) -> list[np.ndarray]:
        """P(correct) per candidate, float32 [C_i], for each of `learners`."""
        if self.rank:                                        # output [b, width]
            return [np.asarray(output[row, :n], dtype=np.float32) for row, n in self.reads]
        return [np.asarray(output[first:first + n, -1], dtype=np.float32) for first, n in self.reads]  # [rows, L]


class StepFeeds(Protocol):
    """The rows an Encoder builds for the learner-state path (serving/state/): the same as the rank graph's."""

    def history_row(self, learner: EncodedLearner, window: int,
                    width: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(questions [window - 1], skills [window - 1, K], responses [window - 1]): the rank graph's
        left-padded history row (K = `width`, 0: the learner's widest set)."""

    def split_candidates(self, learners: list[EncodedLearner],
                         limit: int) -> tuple[list[EncodedLearner], list[int]]:
        """Learners with more than `limit` candidates as several (same history), and each piece's owner."""

    def candidate_width(self, n: int) -> int:
        """The padded candidate width for `n` candidates."""

    def widen(self, skills: np.ndarray, width: int) -> np.ndarray:
        """Skill sets [N, k] -> [N, width], padded."""
