"""From a validated learner (raw platform ids) to the model's input rows: vocabulary mapping and
left-padded windows, exactly as training builds them (training/data/protocol.py, routerkt/contract/signature.py).

Mapping (the model version's vocab.json); skills travel as SETS, rows [N, K] of raw ids padded
with NO_SKILL (serving/core/calls.py), and leave as model ids padded with PAD_ID:
- question id not in the vocabulary -> UNK_ID (1). The model then has no question-specific
  information (AKT's Rasch difficulty of UNK, i.e. it falls back on the skill); counted as
  routerkt_unknown_ids_total{kind="question"}.
- skills absent -> the skill set the vocabulary recorded for the question (question_skills); a
  question without one (an unknown question, or one only seen without a skill) gets {UNK_ID};
- skill id -1 ("unknown skill", as -1 in the training CSV) and any other skill id not in the
  vocabulary (a skill the platform added after this version was trained: Observe stores it,
  `routerkt retrain` gives it an id) -> UNK_ID, exactly like an unknown question id, in the
  history and in the candidates; so a Predict by learner_id and one sending the same history
  explicitly get the same input. Every skill slot mapped to UNK_ID (these, and a looked-up
  {UNK_ID} above) counts as routerkt_unknown_ids_total{kind="skill"}.
Unknown ids are counted for the interactions that reach the model and the candidates. Single-skill
traffic (every set of one, a vocabulary of one skill per question) keeps the one-column path:
[N, 1] throughout. (Mastery's requested skills are the exception: serving/queries/mastery.py rejects an
unknown one, whose knowledge state is undefined.)

Skill axis: every skill tensor gets a last axis K = the widest set among the learners of one
inference (at least 1); narrower sets are padded with PAD_ID, which the model's set mean ignores.
A version exported before skill sets (2-D skill inputs in its config.pbtxt; catalog.py marks it
`skill_sets=False`) gets each set's FIRST skill instead, i.e. exactly what it got before for
single-skill requests, and a set's first skill otherwise.

Windows: only the most recent `window - 1` interactions are used (the candidate takes the last slot).
Each candidate becomes one row of length `window`: padding (question = skill = PAD_ID 0,
response -1) on the left, then the used history oldest first, and the candidate at index window-1
with response 0 (ignored by the causal model). All rows of one learner share the history part.
That is the score graph's input. The rank graph (what the exporter serves) gets that history part
once per learner, [window - 1], and the candidates beside it, padded to CANDIDATE_WIDTHS (candidate_width)
so requests of different learners share a few shapes; both give the same probabilities (<= 1e-5).
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable

import numpy as np

from routerkt.contract.signature import (CANDIDATE_RESPONSE, NO_SKILL, PAD_ID, PAD_RESPONSE, RANK, SCORE, UNK_ID,
                                         skill_axis)
from routerkt.contract.vocab import Vocab
from serving.core.calls import ABSENT_SKILL
from serving.core.encoded import EncodedLearner, Inference
from serving.core.validation import LearnerInput

if TYPE_CHECKING:
    from serving.core.catalog import ModelVersion


CountUnknown = Callable[[str, int], None]   # (kind "question" | "skill", how many)
# By measurement (docs/benchmarks.md, "Candidate widths"): the rank forward attends over history +
# candidates, so its cost grows with the padded width (in process, history 99: width 64 ~1.7-1.9x
# width 1, 24-32 ~1.0-1.3x); 20 candidates padded to 64 cost 1.7-1.9x one through the gateway.
CANDIDATE_WIDTHS = (1, 4, 8, 16, 24, 32, 48, 64)
WIDE_STEP = 8             # beyond the last width (Mastery over a vocabulary): multiples of this (115 -> 120: 2.9x
                          # width 1 in process vs 3.7x at 128; one row beats 2 x 64 (4.0x) and 4 x 32 (5.9x))


def encode_learner(learner: LearnerInput, vocab: Vocab, window: int,
                   count_unknown: CountUnknown = lambda kind, n: None, band: bool = False) -> EncodedLearner:
    """Map `learner` with `vocab` (ids it does not know -> UNK_ID, counted) and keep the most
    recent window-1 interactions (a band model: all of them)."""
    keep = learner.history_length if band else max(window - 1, 0)
    start = max(learner.history_length - keep, 0)
    questions, skills, unknown_questions, unknown_skills = _map(
        learner.history_questions[start:], learner.history_skills[start:], vocab)
    candidate_questions, candidate_skills, unknown_candidates, unknown_candidate_skills = _map(
        learner.candidate_questions, learner.candidate_skills, vocab)
    if unknown_questions + unknown_candidates:
        count_unknown("question", unknown_questions + unknown_candidates)
    if unknown_skills + unknown_candidate_skills:
        count_unknown("skill", unknown_skills + unknown_candidate_skills)
    return EncodedLearner(questions=questions, skills=skills,
                          responses=learner.history_correct[start:].astype(np.int64),
                          candidate_questions=candidate_questions, candidate_skills=candidate_skills)


def build_windows(learner: EncodedLearner, window: int,
                  width: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(questions [C, window], skills [C, window, K], responses [C, window]), int64, one left-padded
    row per candidate; K = `width` (0: the learner's widest set)."""
    n_history, n_candidates = learner.history_used, learner.n_candidates
    if n_history > window - 1:
        raise ValueError(f"history of {n_history} interactions does not fit a window of {window}")
    width = width or learner.width
    history = history_row(learner, window, width)            # the left-padded history part, [window - 1]
    questions = np.empty((n_candidates, window), dtype=np.int64)
    responses = np.empty((n_candidates, window), dtype=np.int64)
    skills = np.empty((n_candidates, window, width), dtype=np.int64)
    for rows, part in zip((questions, skills, responses), history):
        rows[:, :window - 1] = part
    questions[:, window - 1] = learner.candidate_questions
    skills[:, window - 1] = widen(learner.candidate_skills, width)
    responses[:, window - 1] = CANDIDATE_RESPONSE
    return questions, skills, responses


def split_candidates(learners: list[EncodedLearner], limit: int) -> tuple[list[EncodedLearner], list[int]]:
    """Each learner with more than `limit` candidates as several learners of the same history and at
    most `limit` candidates each (in order), with the index of the learner each piece came from.
    Exact for the rank graph: a candidate sees the history and itself only."""
    pieces: list[EncodedLearner] = []
    owners: list[int] = []
    for i, learner in enumerate(learners):
        for first in range(0, max(learner.n_candidates, 1), limit):
            pieces.append(learner if learner.n_candidates <= limit else dataclasses.replace(
                learner, candidate_questions=learner.candidate_questions[first:first + limit],
                candidate_skills=learner.candidate_skills[first:first + limit]))
            owners.append(i)
    return pieces, owners


def history_row(learner: EncodedLearner, window: int,
                width: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(questions [window - 1], skills [window - 1, K], responses [window - 1]) of the rank graph's
    history, left-padded: exactly the history part of build_windows' rows (K as there)."""
    length, n = window - 1, learner.history_used
    width = width or learner.width
    questions = np.full(length, PAD_ID, dtype=np.int64)
    skills = np.full((length, width), PAD_ID, dtype=np.int64)
    responses = np.full(length, PAD_RESPONSE, dtype=np.int64)
    questions[length - n:], responses[length - n:] = learner.questions, learner.responses
    skills[length - n:, :learner.skills.shape[1]] = learner.skills
    return questions, skills, responses


def widen(skills: np.ndarray, width: int) -> np.ndarray:
    """Model skill sets [N, k] -> [N, width], PAD_ID in the added slots."""
    if skills.shape[1] == width:
        return skills
    out = np.full((skills.shape[0], width), PAD_ID, dtype=np.int64)
    out[:, :skills.shape[1]] = skills
    return out


def candidate_width(n: int) -> int:
    """Candidates are padded to the next of CANDIDATE_WIDTHS (then multiples of WIDE_STEP), so that
    rank requests of learners with different numbers of candidates share a few shapes Triton can
    batch together, without paying much for padding (the rank forward's cost grows with the width)."""
    for width in CANDIDATE_WIDTHS:
        if n <= width:
            return width
    return -(-n // WIDE_STEP) * WIDE_STEP


class WindowEncoder:
    """The pipeline's Encoder (serving/pipeline/parts.py): vocabulary mapping, then the served graph's
    inputs: rank (one history row + the padded candidates per learner) or score (one left-padded
    window per candidate). Unknown ids are reported to `count_unknown` (a metric)."""

    def __init__(self, count_unknown: CountUnknown = lambda kind, n: None) -> None:
        self.count_unknown = count_unknown

    def encode(self, learner: LearnerInput, model: ModelVersion) -> EncodedLearner:
        return encode_learner(learner, model.vocab, model.window, self.count_unknown, model.band)

    def inferences(self, learners: list[EncodedLearner], model: ModelVersion, rows_limit: int) -> list[Inference]:
        """Whole learners per inference, at most `rows_limit` rows each (learners: rank; candidates: score)."""
        rank = model.graph.name == RANK.name
        chunks: list[list[int]] = [[]]
        rows = 0
        for i, learner in enumerate(learners):
            need = 1 if rank else learner.n_candidates
            if chunks[-1] and rows + need > rows_limit:
                chunks.append([])
                rows = 0
            chunks[-1].append(i)
            rows += need
        build = self._rank if rank else self._score
        inferences = [build([learners[i] for i in chunk], chunk, model) for chunk in chunks]
        if not model.skill_sets:                             # exported before skill sets: first skills
            for inference in inferences:
                for spec in model.graph.inputs:
                    if skill_axis(spec):
                        inference.feeds[spec.name] = np.ascontiguousarray(inference.feeds[spec.name][..., 0])
        return inferences

    # -- the learner-state path's feeds (serving/state/): the rows the rank graph would get -----------
    def encode_new(self, learner: LearnerInput, model: ModelVersion) -> EncodedLearner:
        """Newly stored answers (Observe's) in model ids, uncounted: the learner's next Predict counts them."""
        return encode_learner(learner, model.vocab, model.window, band=model.band)

    history_row = staticmethod(history_row)
    split_candidates = staticmethod(split_candidates)
    candidate_width = staticmethod(candidate_width)
    widen = staticmethod(widen)

    def _rank(self, learners: list[EncodedLearner], indices: list[int], model: ModelVersion) -> Inference:
        width = candidate_width(max(learner.n_candidates for learner in learners))
        skills = max(learner.width for learner in learners)
        history = [history_row(learner, model.window, skills) for learner in learners]
        candidate_questions = np.full((len(learners), width), PAD_ID, dtype=np.int64)
        candidate_skills = np.full((len(learners), width, skills), PAD_ID, dtype=np.int64)
        for k, learner in enumerate(learners):
            candidate_questions[k, :learner.n_candidates] = learner.candidate_questions
            candidate_skills[k, :learner.n_candidates, :learner.candidate_skills.shape[1]] = learner.candidate_skills
        arrays = [np.stack([h[j] for h in history]) for j in range(3)] + [candidate_questions, candidate_skills]
        return Inference(indices, dict(zip(RANK.input_names, arrays)),
                         [(k, learner.n_candidates) for k, learner in enumerate(learners)], rank=True)

    def _score(self, learners: list[EncodedLearner], indices: list[int], model: ModelVersion) -> Inference:
        skills = max(learner.width for learner in learners)
        windows = [build_windows(learner, model.window, skills) for learner in learners]
        arrays = [np.concatenate([w[j] for w in windows]) for j in range(3)]
        reads, first = [], 0
        for learner in learners:
            reads.append((first, learner.n_candidates))
            first += learner.n_candidates
        return Inference(indices, dict(zip(SCORE.input_names, arrays)), reads, rank=False)

SMALL_ROWS = 16         # _map of at most this many rows goes by dictionary lookups


def _map(raw_questions: np.ndarray, raw_skills: np.ndarray, vocab: Vocab) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(question ids [n], skill sets [n, K] in model ids, #unknown questions, #skill slots mapped to
    UNK). Absent sets (first slot ABSENT_SKILL) are the vocabulary's set of the question."""
    if raw_questions.shape[0] <= SMALL_ROWS:
        return _map_small(raw_questions, raw_skills, vocab)
    return _map_arrays(raw_questions, raw_skills, vocab)


def _map_arrays(raw_questions: np.ndarray, raw_skills: np.ndarray,
                vocab: Vocab) -> tuple[np.ndarray, np.ndarray, int, int]:
    """_map with numpy, for many rows."""
    questions = vocab.encode_questions(raw_questions)
    absent = raw_skills[:, 0] == ABSENT_SKILL
    if not absent.any():
        resolved = raw_skills
    else:
        looked = vocab.skill_sets_of_questions(raw_questions[absent])         # [m, max_skills], NO_SKILL padded
        used = 1 if looked.shape[1] == 1 else max(int((looked != NO_SKILL).any(axis=0).sum()), 1)
        width = raw_skills.shape[1]
        if used <= width:                                          # single skills: one column throughout
            resolved = raw_skills.copy()
        else:
            resolved = np.full((raw_skills.shape[0], used), NO_SKILL, dtype=np.int64)
            resolved[:, :width] = raw_skills
        resolved[absent, :used] = looked[:, :used]
    skills = vocab.encode_skills(resolved)         # -1 and ids the vocabulary lacks -> UNK_ID
    if resolved.shape[1] > 1:                      # unused slots (one column holds none once resolved)
        skills[resolved == NO_SKILL] = PAD_ID
    return questions, skills, int((questions == UNK_ID).sum()), int((skills == UNK_ID).sum())


def _map_small(raw_questions: np.ndarray, raw_skills: np.ndarray,
               vocab: Vocab) -> tuple[np.ndarray, np.ndarray, int, int]:
    """_map by dictionary lookups: the same result, without numpy's per-call cost on a few rows (a Predict's
    candidates, a cached learner's new answers; tests/unit/test_skill_sets_encoding.py compares the two)."""
    n, width = raw_skills.shape
    rows = raw_skills.tolist()
    absent = [k for k, row in enumerate(rows) if row[0] == ABSENT_SKILL]
    if absent:
        raw = raw_questions.tolist()
        looked = [vocab.question_skills.get(raw[k], (-1,)) for k in absent]
        used = 1 if vocab.max_skills == 1 else max(len(skill_set) for skill_set in looked)
        if used > width:
            rows = [row + [NO_SKILL] * (used - width) for row in rows]
        for k, skill_set in zip(absent, looked):
            rows[k][:used] = list(skill_set[:used]) + [NO_SKILL] * (used - len(skill_set[:used]))
    pad = len(rows[0]) > 1 if rows else False          # unused slots of a set: PAD_ID (one column holds none)
    skill_ids = vocab.skills
    skills = [[PAD_ID if pad and s == NO_SKILL else skill_ids.get(s, UNK_ID) for s in row] for row in rows]
    question_ids = vocab.questions
    questions = [question_ids.get(q, UNK_ID) for q in raw_questions.tolist()]
    skill_array = np.array(skills, dtype=np.int64).reshape(n, len(rows[0]) if rows else width)
    return (np.array(questions, dtype=np.int64), skill_array, questions.count(UNK_ID),
            sum(row.count(UNK_ID) for row in skills))
