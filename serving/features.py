"""From a validated learner (raw platform ids) to the model's input rows: vocabulary mapping and
left-padded windows, exactly as training builds them (training/data/protocol.py, routerkt/contract/signature.py).

Mapping (the model version's vocab.json):
- question id not in the vocabulary -> UNK_ID (1). The model then has no question-specific
  information (AKT's Rasch difficulty of UNK, i.e. it falls back on the skill); counted as
  routerkt_unknown_ids_total{kind="question"}.
- skill id absent -> the skill the vocabulary recorded for the question (question_skill); a question
  without one (an unknown question, or one only seen without a skill) gets UNK_ID;
- skill id -1 -> UNK_ID ("unknown skill", as -1 in the training CSV);
  both of these count as routerkt_unknown_ids_total{kind="skill"};
- any other skill id not in the vocabulary -> INVALID_ARGUMENT naming the field (a typo or a model
  trained on another skill taxonomy must not silently degrade predictions); counted as well.
Unknown ids are counted for the interactions that reach the model and the candidates; rejected skill
ids are checked (and counted) over the whole history.

Windows: only the most recent `window - 1` interactions are used (the candidate takes the last slot).
Each candidate becomes one row of length `window`: padding (question = skill = PAD_ID 0,
response -1) on the left, then the used history oldest first, and the candidate at index window-1
with response 0 (ignored by the causal model). All rows of one learner share the history part.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from routerkt.contract.signature import CANDIDATE_RESPONSE, PAD_ID, PAD_RESPONSE, UNK_ID
from serving.errors import invalid_argument
from routerkt.contract.vocab import Vocab
from serving.requests import ABSENT_SKILL
from serving.validation import LearnerInput

if TYPE_CHECKING:
    from serving.catalog import ModelVersion



CountUnknown = Callable[[str, int], None]   # (kind "question" | "skill", how many)


@dataclass
class EncodedLearner:
    """One learner in model ids, history already truncated to the window."""

    questions: np.ndarray            # int64 [n] used history, oldest first
    skills: np.ndarray               # int64 [n]
    responses: np.ndarray            # int64 [n], 0/1
    candidate_questions: np.ndarray  # int64 [C]
    candidate_skills: np.ndarray     # int64 [C]

    @property
    def history_used(self) -> int:
        return int(self.questions.shape[0])

    @property
    def n_candidates(self) -> int:
        return int(self.candidate_questions.shape[0])


def encode_learner(learner: LearnerInput, vocab: Vocab, window: int,
                   count_unknown: CountUnknown = lambda kind, n: None) -> EncodedLearner:
    """Map `learner` with `vocab` and keep the most recent window-1 interactions.
    Raises INVALID_ARGUMENT for a skill id the vocabulary does not know."""
    _reject_unknown_skills(learner.history_skills, vocab, f"{learner.prefix}history", count_unknown)
    _reject_unknown_skills(learner.candidate_skills, vocab, f"{learner.prefix}candidates", count_unknown)

    keep = max(window - 1, 0)
    start = max(learner.history_length - keep, 0)
    hq_raw = learner.history_questions[start:]
    hs_raw = learner.history_skills[start:]
    hq, hs, unknown_q, unknown_s = _map(hq_raw, hs_raw, vocab)
    cq, cs, cand_unknown_q, cand_unknown_s = _map(learner.candidate_questions, learner.candidate_skills, vocab)
    if unknown_q + cand_unknown_q:
        count_unknown("question", unknown_q + cand_unknown_q)
    if unknown_s + cand_unknown_s:
        count_unknown("skill", unknown_s + cand_unknown_s)
    return EncodedLearner(questions=hq, skills=hs, responses=learner.history_correct[start:].astype(np.int64),
                          candidate_questions=cq, candidate_skills=cs)


def build_windows(learner: EncodedLearner, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(questions, skills, responses), each int64 [C, window], one left-padded row per candidate."""
    n, c = learner.history_used, learner.n_candidates
    if n > window - 1:
        raise ValueError(f"history of {n} interactions does not fit a window of {window}")
    questions = np.full((c, window), PAD_ID, dtype=np.int64)
    skills = np.full((c, window), PAD_ID, dtype=np.int64)
    responses = np.full((c, window), PAD_RESPONSE, dtype=np.int64)
    first = window - 1 - n                         # index of the oldest used interaction
    questions[:, first:window - 1] = learner.questions
    skills[:, first:window - 1] = learner.skills
    responses[:, first:window - 1] = learner.responses
    questions[:, window - 1] = learner.candidate_questions
    skills[:, window - 1] = learner.candidate_skills
    responses[:, window - 1] = CANDIDATE_RESPONSE
    return questions, skills, responses


class WindowEncoder:
    """The pipeline's Encoder (serving/parts.py): vocabulary mapping + one left-padded window per
    candidate; unknown ids are reported to `count_unknown` (the gateway counts them in a metric)."""

    def __init__(self, count_unknown: CountUnknown = lambda kind, n: None) -> None:
        self.count_unknown = count_unknown

    def encode(self, learner: LearnerInput, model: ModelVersion) -> EncodedLearner:
        return encode_learner(learner, model.vocab, model.window, self.count_unknown)

    def rows(self, learner: EncodedLearner, model: ModelVersion) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return build_windows(learner, model.window)


def _map(raw_questions: np.ndarray, raw_skills: np.ndarray, vocab: Vocab) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(question ids, skill ids, #unknown questions, #skills mapped to UNK) in model ids."""
    questions = vocab.encode_questions(raw_questions)
    absent = raw_skills == ABSENT_SKILL
    resolved = np.where(absent, vocab.skills_of_questions(raw_questions), raw_skills)
    skills = vocab.encode_skills(resolved)         # -1 (unknown) -> UNK_ID; unknown ids were rejected
    return questions, skills, int((questions == UNK_ID).sum()), int((skills == UNK_ID).sum())


def _reject_unknown_skills(raw_skills: np.ndarray, vocab: Vocab, list_field: str,
                           count_unknown: CountUnknown) -> None:
    explicit = raw_skills >= 0
    if not explicit.any():
        return
    unknown = explicit & (vocab.encode_skills(raw_skills) == UNK_ID)
    if unknown.any():
        count_unknown("skill", int(unknown.sum()))
        index = int(np.flatnonzero(unknown)[0])
        raise invalid_argument(f"{list_field}[{index}].skill_id",
                               f"unknown skill id {int(raw_skills[index])} for this model version "
                               f"(use -1 for an unknown skill, or omit skill_id)")

