"""The synthetic generator's hidden truth per learner: true mastery per skill, pivotal answers, last practices."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from training.data.synthetic import (PIVOT_CORRECT_NEEDED, PIVOT_SKILL, LearnerState, LearnerTrace, SyntheticConfig,
                                     World, interactions, sigmoid, simulate_traces)

AVERAGE_DIFFICULTY = 0.0      # "an average question of the skill": difficulties are drawn from N(0, 0.8)


@dataclass
class LearnerTruth:
    """One learner of a synthetic file with what the generator knows about it (training/data/synthetic.py).

    Steps are 0-based positions in the learner's sequence (the file's `order`)."""

    user_id: int
    questions: np.ndarray       # int64 [T] raw question ids
    skills: np.ndarray          # int64 [T] raw skill ids (the question's own skill)
    correct: np.ndarray         # int64 [T]
    p_correct: np.ndarray       # float64 [T] the P(correct) each answer was drawn with
    profile: dict               # ability, tau, reviewer, period, length
    world: World
    final: LearnerState         # the hidden state after the last step

    @property
    def length(self) -> int:
        return int(self.questions.shape[0])

    @property
    def n_skills(self) -> int:
        return len(self.final.knowledge)

    def state_at(self, t: int) -> LearnerState:
        """The hidden state before step t (0 <= t <= length), rebuilt from the rows and the profile."""
        state = LearnerState(theta=self.profile["ability"], tau=self.profile["tau"],
                             knowledge=[0.0] * self.n_skills, last_seen=[-1] * self.n_skills)
        for step in range(t):
            state.learn(int(self.skills[step]), step, int(self.correct[step]))
        return state

    def mastery_at(self, t: int, state: LearnerState | None = None) -> np.ndarray:
        """True mastery [n_skills] before step t: the generator's P(correct) at step t on a question of
        each skill with difficulty 0, sigmoid(theta + 2 k_eff + pivot - 0.3)."""
        state = state if state is not None else self.state_at(t)
        return np.array([sigmoid(state.logit(s, AVERAGE_DIFFICULTY, t, self.world.dependent))
                         for s in range(self.n_skills)])

    @property
    def mastery(self) -> np.ndarray:
        """True mastery at the end of the history (before step `length`, the next one)."""
        return self.mastery_at(self.length, self.final)

    @property
    def pivotal(self) -> np.ndarray:
        """Steps of the first PIVOT_CORRECT_NEEDED correct answers on the pivotal skill: the answers
        that unlock the dependent skills (all of them once unlocked; fewer: not unlocked)."""
        hits = np.flatnonzero((self.skills == PIVOT_SKILL) & (self.correct == 1))
        return hits[:PIVOT_CORRECT_NEEDED].astype(np.int64)

    def pivotal_for(self, skill: int, t: int) -> np.ndarray:
        """The pivotal steps behind a candidate of `skill` at step t: the unlocking answers when the
        skill depends on skill 0 and was unlocked before t; else none."""
        pivotal = self.pivotal
        if skill in self.world.dependent and pivotal.size == PIVOT_CORRECT_NEEDED and pivotal[-1] < t:
            return pivotal
        return pivotal[:0]

    def last_practice(self, skill: int, t: int) -> int:
        """The step of the last practice of `skill` before step t (-1: none): the interaction whose
        gap drives the skill's forgetting at t."""
        hits = np.flatnonzero(self.skills[:t] == skill)
        return int(hits[-1]) if hits.size else -1


def _truth(user: int, trace: LearnerTrace, world: World) -> LearnerTruth:
    rows = np.asarray(trace.rows, dtype=np.int64).reshape(-1, 3)
    return LearnerTruth(user_id=user, questions=rows[:, 0], skills=rows[:, 1], correct=rows[:, 2],
                        p_correct=np.asarray(trace.p_correct, dtype=np.float64), profile=trace.profile,
                        world=world, final=trace.state)


def learner_truths(cfg: SyntheticConfig) -> tuple[pd.DataFrame, list[LearnerTruth]]:
    """(the interactions `simulate(cfg)` writes, the truth of each learner; user i = truths[i]), from
    one simulation."""
    world, traces = simulate_traces(cfg)
    return interactions(world, traces, cfg), [_truth(user, trace, world) for user, trace in enumerate(traces)]
