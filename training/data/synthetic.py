"""Synthetic learners: the embedded default dataset (for `make serve` and the tests).

Generative story (everything drawn from `np.random.default_rng(seed)`, so a seed gives one file):

World, drawn once:
- `n_skills` skills and `n_questions` questions; question q < n_skills belongs to skill q (so every
  skill has one), the others to a uniformly drawn skill. Each question has a difficulty b ~ N(0, 0.8).
- Skill 0 is PIVOTAL: skills 1 .. max(1, n_skills // 4) depend on it (`dependent_skills`).

Learner, drawn independently:
- ability theta ~ N(0, 0.8); forgetting time constant tau ~ 20 * LogNormal(0, 0.4) steps;
  number of interactions T ~ Uniform{min_len .. max_len}.
- 30% are REVIEWERS with a period P ~ Uniform{4 .. 8}: every P-th step they revisit the practised
  skill they have not seen for longest (the others only come back to a skill by chance), and their
  spaced practice makes memory durable: their tau is 3x longer (PERIODIC REVIEW).

Each step t:
1. Skill: a reviewer's review step picks as above. Otherwise the learner stays on the current skill
   with probability 0.65, or switches to a skill drawn with weights (skill 0: 3, others: 1).
2. Question: uniform among the skill's questions.
3. Knowledge: k_s (starts at 0) fades with the steps since the skill was last practised:
   k_eff = k_s * (0.25 + 0.75 * exp(-gap / tau))                                   (FORGETTING)
4. Answer: P(correct) = sigmoid(theta - b_q + 2 * k_eff + pivot - 0.3), where pivot is +1.2 on a
   dependent skill once the learner has answered skill 0 correctly 3 times, and -0.6 before
   (PIVOTAL SKILL); 0 on other skills.
5. Learning: k_s = min(1.5, k_eff + (0.3 if correct else 0.15)), and the skill's clock restarts.

So correctness depends on the question, the learner, the recency and outcome of practice on the same
skill, and on one distant event (mastering skill 0) - structure an attention model can find.
Raw ids are 0-based: user_id 0..n-1, question_id 0..n_questions-1, skill_id 0..n_skills-1.

Multi-skill questions (`multi_skill` > 0, off by default, so default files stay byte-identical):
after the simulation, each question is tagged with a second skill with probability `multi_skill`
(drawn from its own generator, seeded by (seed, 1); never the question's own skill). The tag does
not change any answer. `expanded` writes such an interaction the way expanded files do, one row per
skill (same learner, question and answer; `order` renumbered), else as one row with `a;b`.

The hidden truth behind a file (true per-skill mastery, the answers that unlocked the pivotal skill)
comes from the same simulation (`simulate_traces`): training/data/synthetic_truth.py.
"""
from __future__ import annotations

import bisect
import gzip
import math
import os
from dataclasses import dataclass

import numpy as np
import pandas as pd

from routerkt.atomic import atomic_write_bytes
from routerkt.errors import UserError
from training.data.csv_reader import COLUMNS

PIVOT_SKILL = 0
PIVOT_CORRECT_NEEDED = 3   # correct answers on skill 0 that unlock the dependent skills
PIVOT_BONUS = 1.2          # logit bonus on dependent skills once unlocked
PIVOT_PENALTY = -0.6       # logit on dependent skills before that
REVIEWER_SHARE = 0.3
REVIEWER_TAU_FACTOR = 3.0  # reviewers forget this much more slowly
STAY_PROB = 0.65           # probability of practising the same skill again
PIVOT_WEIGHT = 3.0         # skill-choice weight of skill 0 (others 1)
RETAINED = 0.25            # share of knowledge never forgotten
KNOWLEDGE_SCALE = 2.0      # logit per unit of knowledge
KNOWLEDGE_MAX = 1.5
GAIN_CORRECT, GAIN_WRONG = 0.3, 0.15
BASE_LOGIT = -0.3


@dataclass
class SyntheticConfig:
    n_learners: int = 600
    n_skills: int = 20      # skill 0 is pivotal
    n_questions: int = 200  # >= n_skills
    min_len: int = 10       # interactions per learner, uniform in [min_len, max_len]
    max_len: int = 300
    seed: int = 7
    multi_skill: float = 0.0  # share of questions tagged with a second skill (module docstring)
    expanded: bool = False  # multi-skill interactions as one row per skill (else one row, "a;b")

    def validate(self) -> None:
        if self.n_learners < 1:
            raise UserError(f"learners must be >= 1, got {self.n_learners}")
        if self.n_skills < 2:
            raise UserError(f"skills must be >= 2 (skill 0 is pivotal), got {self.n_skills}")
        if self.n_questions < self.n_skills:
            raise UserError(f"questions ({self.n_questions}) must be >= skills ({self.n_skills})")
        if not 1 <= self.min_len <= self.max_len:
            raise UserError(f"need 1 <= min-len <= max-len, got {self.min_len} and {self.max_len}")
        if not 0.0 <= self.multi_skill <= 1.0:
            raise UserError(f"multi-skill must be a share in [0, 1], got {self.multi_skill}")


def sigmoid(logit: float) -> float:
    return 1.0 / (1.0 + math.exp(-logit))


def dependent_skills(n_skills: int) -> range:
    """Skills whose success depends on having mastered the pivotal skill 0."""
    return range(1, max(1, n_skills // 4) + 1)


@dataclass
class World:
    """What is drawn once (module docstring, "World"): each question's skill and difficulty."""

    question_skill: np.ndarray      # int64 [n_questions]
    difficulty: list[float]         # [n_questions]
    questions_of: list[list[int]]   # skill -> its questions
    choice_cdf: list[float]         # cumulative skill-choice weights
    dependent: frozenset[int]       # skills that depend on the pivotal skill 0


def draw_world(rng: np.random.Generator, cfg: SyntheticConfig) -> World:
    question_skill = np.concatenate([np.arange(cfg.n_skills),
                                     rng.integers(0, cfg.n_skills, cfg.n_questions - cfg.n_skills)])
    difficulty = rng.normal(0.0, 0.8, cfg.n_questions).tolist()
    weights = [PIVOT_WEIGHT if s == PIVOT_SKILL else 1.0 for s in range(cfg.n_skills)]
    return World(question_skill=question_skill, difficulty=difficulty,
                 questions_of=[np.flatnonzero(question_skill == s).tolist() for s in range(cfg.n_skills)],
                 choice_cdf=np.cumsum(weights).tolist(), dependent=frozenset(dependent_skills(cfg.n_skills)))


@dataclass
class LearnerState:
    """A learner's hidden state between two steps: what every answer's probability is computed from."""

    theta: float
    tau: float
    knowledge: list[float]          # k_s after the skill's last practice
    last_seen: list[int]            # step of the skill's last practice, -1 = never
    pivot_correct: int = 0          # correct answers on the pivotal skill so far

    def effective(self, skill: int, t: int) -> float:
        """k_eff of `skill` at step t (FORGETTING)."""
        if self.last_seen[skill] < 0:
            return 0.0
        gap = t - self.last_seen[skill]
        return self.knowledge[skill] * (RETAINED + (1 - RETAINED) * math.exp(-gap / self.tau))

    def logit(self, skill: int, difficulty: float, t: int, dependent: frozenset[int]) -> float:
        """The logit of P(correct) at step t on a question of `skill` with `difficulty`."""
        pivot = 0.0
        if skill in dependent:
            pivot = PIVOT_BONUS if self.pivot_correct >= PIVOT_CORRECT_NEEDED else PIVOT_PENALTY
        return self.theta - difficulty + KNOWLEDGE_SCALE * self.effective(skill, t) + pivot + BASE_LOGIT

    def learn(self, skill: int, t: int, correct: int) -> None:
        """Step t's practice of `skill` (LEARNING; the pivotal count)."""
        gain = GAIN_CORRECT if correct else GAIN_WRONG
        self.knowledge[skill] = min(KNOWLEDGE_MAX, self.effective(skill, t) + gain)
        self.last_seen[skill] = t
        if skill == PIVOT_SKILL and correct:
            self.pivot_correct += 1


@dataclass
class LearnerTrace:
    """One simulated learner: profile, (question, skill, correct) rows, the P(correct) each answer was
    drawn with, and the hidden state after the last step."""

    profile: dict
    rows: list[tuple[int, int, int]]
    p_correct: list[float]
    state: LearnerState


def _learner(rng: np.random.Generator, cfg: SyntheticConfig, world: World) -> LearnerTrace:
    """Simulate one learner (module docstring, "Learner" and "Each step t")."""
    theta = float(rng.normal(0.0, 0.8))
    tau = float(20.0 * rng.lognormal(0.0, 0.4))
    reviewer = bool(rng.random() < REVIEWER_SHARE)
    period = int(rng.integers(4, 9)) if reviewer else 0
    if reviewer:
        tau *= REVIEWER_TAU_FACTOR
    length = int(rng.integers(cfg.min_len, cfg.max_len + 1))
    u = rng.random((length, 4))  # stay?, which skill, which question, correct?

    state = LearnerState(theta=theta, tau=tau, knowledge=[0.0] * cfg.n_skills, last_seen=[-1] * cfg.n_skills)
    last_seen, cdf = state.last_seen, world.choice_cdf
    current = bisect.bisect_right(cdf, u[0, 1] * cdf[-1])
    rows, probs = [], []
    for t in range(length):
        review = reviewer and t % period == period - 1
        practised = [s for s in range(cfg.n_skills) if last_seen[s] >= 0 and s != current] if review else []
        if practised:
            skill = min(practised, key=lambda s: last_seen[s])
        else:
            if t > 0 and u[t, 0] >= STAY_PROB:
                current = bisect.bisect_right(cdf, u[t, 1] * cdf[-1])
            skill = current
        pool = world.questions_of[skill]
        q = pool[min(int(u[t, 2] * len(pool)), len(pool) - 1)]
        p = sigmoid(state.logit(skill, world.difficulty[q], t, world.dependent))
        correct = int(u[t, 3] < p)
        state.learn(skill, t, correct)
        rows.append((q, skill, correct))
        probs.append(p)
    profile = {"ability": theta, "tau": tau, "reviewer": reviewer, "period": period, "length": length}
    return LearnerTrace(profile=profile, rows=rows, p_correct=probs, state=state)


def simulate_traces(cfg: SyntheticConfig) -> tuple[World, list[LearnerTrace]]:
    """The world and every learner's trace: the one simulation behind `simulate` and the truth
    (training/data/synthetic_truth.py)."""
    cfg.validate()
    rng = np.random.default_rng(cfg.seed)
    world = draw_world(rng, cfg)
    return world, [_learner(rng, cfg, world) for _ in range(cfg.n_learners)]


def interactions(world: World, traces: list[LearnerTrace], cfg: SyntheticConfig) -> pd.DataFrame:
    """The traces' interactions in the canonical columns, sorted by user then order (user i = traces[i])."""
    users, orders, questions, skills, answers = [], [], [], [], []
    for user, trace in enumerate(traces):
        users.extend([user] * len(trace.rows))
        orders.extend(range(len(trace.rows)))
        for q, s, c in trace.rows:
            questions.append(q)
            skills.append(s)
            answers.append(c)
    df = pd.DataFrame({"user_id": users, "order": orders, "question_id": questions, "skill_id": skills,
                       "correct": answers}, columns=list(COLUMNS)).astype(np.int64)
    if cfg.multi_skill > 0:
        df = _second_skills(df, world.question_skill, cfg)
    return df


def simulate(cfg: SyntheticConfig) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(interactions in the canonical columns, one profile row per learner with the hidden truth)."""
    world, traces = simulate_traces(cfg)
    profiles = [{"user_id": user, **trace.profile} for user, trace in enumerate(traces)]
    return interactions(world, traces, cfg), pd.DataFrame(profiles)


def _second_skills(df: pd.DataFrame, question_skill: np.ndarray, cfg: SyntheticConfig) -> pd.DataFrame:
    """`df` with a share of the questions tagged with a second skill (module docstring)."""
    rng = np.random.default_rng([cfg.seed, 1])
    tagged = rng.random(cfg.n_questions) < cfg.multi_skill
    second = (question_skill + rng.integers(1, cfg.n_skills, cfg.n_questions)) % cfg.n_skills   # never its own
    extra = second[df["question_id"].to_numpy()]
    multi = tagged[df["question_id"].to_numpy()]
    if not cfg.expanded:
        skills = df["skill_id"].astype(str).where(~multi, df["skill_id"].astype(str) + ";" + extra.astype(str))
        return df.assign(skill_id=skills)
    copies = df[multi].assign(skill_id=extra[multi])
    key = np.arange(len(df)) * 2
    both = pd.concat([df.assign(_k=key), copies.assign(_k=key[multi] + 1)]).sort_values("_k", kind="stable")
    both["order"] = both.groupby("user_id").cumcount()
    return both.drop(columns="_k").reset_index(drop=True)


def generate(n_learners: int, seed: int, n_skills: int = 20, n_questions: int = 200, min_len: int = 10,
             max_len: int = 300, multi_skill: float = 0.0, expanded: bool = False) -> pd.DataFrame:
    """Synthetic interactions in the canonical columns, sorted by user then order."""
    cfg = SyntheticConfig(n_learners=n_learners, n_skills=n_skills, n_questions=n_questions,
                          min_len=min_len, max_len=max_len, seed=seed, multi_skill=multi_skill, expanded=expanded)
    return simulate(cfg)[0]


def write_csv(df: pd.DataFrame, path: str | os.PathLike) -> None:
    """Write `df` as a canonical CSV atomically (routerkt/atomic.py); a `.gz` name is
    gzip-compressed with a zero timestamp, so the same data give the same bytes."""
    data = df.to_csv(index=False, columns=list(COLUMNS)).encode("utf-8")
    if str(path).endswith(".gz"):
        data = gzip.compress(data, mtime=0)        # no name or time in the header: same data, same bytes
    atomic_write_bytes(path, data)
