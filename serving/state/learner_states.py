"""LearnerStates: Predict by learner_id from the learner's cached step-graph state, so that a stored learner's
next prediction costs the interactions added since, plus the candidates' query rows (issue 50).

For each named learner of a call (its history read from the session store and encoded as usual) the
cache entry of (model, version, learner key) decides, by the kept history the entry was computed from
(serving/state/cache.py):
- hit: the same kept history -> step_next only (the candidates against the cached keys);
- appended: the entry's history is a prefix and at most `max_appends` interactions were added ->
  one step_append per added interaction, then step_next;
- miss (no entry) or stale (not a prefix: a new event order, a window that slid past W - 1, a
  forgotten learner observed again, more than max_appends added) -> step_start on the kept history
  (the rebuild of routerkt/contract/step_signature.py, exact at the window edge), then step_next.
Every path gives the rank graph's probabilities on the same kept history (<= 1e-5; the e2e and
integration tests compare them), so a miss or an eviction costs time, never a different answer.
The new state is cached after the call. Learners are taken in chunks of at most `rows` per backend
call, and a learner's candidates in pieces of at most `candidates` (as the rank path splits them).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Awaitable, Callable

import numpy as np

from routerkt.contract.signature import PAD_ID
from routerkt.contract.step_signature import STEP_GRAPHS, UPDATED
from serving.encoder.window import EncodedLearner, candidate_width, history_row, split_candidates
from serving.state.cache import LearnerState, StateCache

if TYPE_CHECKING:
    from serving.core.catalog import ModelVersion

MAX_APPENDS = 4          # beyond: one step_start instead of more sequential step_append calls
StepCall = Callable[[str, dict[str, np.ndarray]], Awaitable[dict[str, np.ndarray]]]   # (graph, feeds) -> outputs
Lookup = Callable[[str, str], None]                                                # (model, result): a metric


@dataclass
class _Learner:
    index: int                       # in the call's learners
    encoded: EncodedLearner
    state: LearnerState | None       # the cached entry, then the updated one
    appends: int | None              # interactions to append; None: rebuild


class LearnerStates:
    """The learner-state path over a StateCache (see the module docstring)."""

    def __init__(self, cache: StateCache, learner_key: Callable[[str], str],
                 on_lookup: Lookup = lambda model, result: None, max_appends: int = MAX_APPENDS) -> None:
        self.cache = cache
        self.learner_key = learner_key      # learner id -> its keyed hash (serving/sessions/keys.py)
        self.on_lookup = on_lookup
        self.max_appends = max_appends

    def forget(self, learner_key: str) -> int:
        """Drop the learner's cached states (ForgetLearner; `learner_key`: the keyed hash)."""
        return self.cache.forget(learner_key)

    async def predict(self, model: ModelVersion, learner_ids: list[str], learners: list[EncodedLearner],
                      run: StepCall, rows: int, candidates: int) -> list[np.ndarray]:
        """P(correct) per candidate, float32 [C_i], of each named learner (`learner_ids`, their encoded
        kept histories and candidates in `learners`), answered by `model`'s step graphs through `run`."""
        learner_keys = [self.learner_key(learner_id) for learner_id in learner_ids]
        plans = [self._plan(model, i, key, learner) for i, (key, learner) in enumerate(zip(learner_keys, learners))]
        out: list[np.ndarray] = [np.empty(0, np.float32)] * len(learners)
        for first in range(0, len(plans), rows):
            chunk = plans[first:first + rows]
            await self._update(model, chunk, run)
            for plan in chunk:
                self.cache.put(model.name, model.version, learner_keys[plan.index], plan.state)
            for plan, probs in zip(chunk, await self._next(model, chunk, run, candidates)):
                out[plan.index] = probs
        return out

    def _plan(self, model: ModelVersion, index: int, key: str, learner: EncodedLearner) -> _Learner:
        state = self.cache.get(model.name, model.version, key)
        appends = None if state is None else state.extended_by(learner.questions, learner.skills, learner.responses)
        if appends is not None and appends > self.max_appends:
            appends = None
        result = ("miss" if state is None else "stale" if appends is None else "hit" if appends == 0
                  else "appended")
        self.on_lookup(model.name, result)
        return _Learner(index, learner, state, appends)

    async def _update(self, model: ModelVersion, chunk: list[_Learner], run: StepCall) -> None:
        """Each learner's state brought to its kept history: rebuilt together, then appended step by step."""
        graphs = STEP_GRAPHS[model.step_state]
        rebuild = [p for p in chunk if p.appends is None]
        if rebuild:
            width = max(p.encoded.skills.shape[1] for p in rebuild)
            rows = [history_row(p.encoded, model.window, width) for p in rebuild]
            feeds = {spec.name: np.stack([r[j] for r in rows]) for j, spec in enumerate(graphs.start.inputs)}
            tensors = await run(graphs.start.name, feeds)
            for k, p in enumerate(rebuild):
                p.state = _entry(p.encoded, p.encoded.history_used, {n: t[k:k + 1] for n, t in tensors.items()})
        for step in range(max((p.appends or 0 for p in chunk), default=0)):
            moving = [p for p in chunk if p.appends is not None and p.appends > step]
            position = [p.state.length for p in moving]                # the interaction each one appends
            width = max(p.encoded.skills.shape[1] for p in moving)
            feeds = {name: np.concatenate([p.state.tensors[name] for p in moving]) for name in _names(graphs.state)}
            feeds["append_question"] = np.array([p.encoded.questions[i] for p, i in zip(moving, position)], np.int64)
            feeds["append_response"] = np.array([p.encoded.responses[i] for p, i in zip(moving, position)], np.int64)
            skills = np.full((len(moving), width), PAD_ID, dtype=np.int64)
            for k, (p, i) in enumerate(zip(moving, position)):
                skills[k, :p.encoded.skills.shape[1]] = p.encoded.skills[i]
            feeds["append_skills"] = skills
            tensors = await run(graphs.append.name, feeds)
            for k, (p, i) in enumerate(zip(moving, position)):
                p.state = _entry(p.encoded, i + 1, {n: tensors[UPDATED + n][k:k + 1] for n in _names(graphs.state)})

    async def _next(self, model: ModelVersion, chunk: list[_Learner], run: StepCall, limit: int) -> list[np.ndarray]:
        """step_next over the chunk's learners, candidates in pieces of at most `limit`."""
        graphs = STEP_GRAPHS[model.step_state]
        pieces, owners = split_candidates([p.encoded for p in chunk], max(limit, 1))
        width = candidate_width(max(piece.n_candidates for piece in pieces))
        skills = max(piece.candidate_skills.shape[1] for piece in pieces)
        questions = np.full((len(pieces), width), PAD_ID, dtype=np.int64)
        candidate_skills = np.full((len(pieces), width, skills), PAD_ID, dtype=np.int64)
        for k, piece in enumerate(pieces):
            questions[k, :piece.n_candidates] = piece.candidate_questions
            candidate_skills[k, :piece.n_candidates, :piece.candidate_skills.shape[1]] = piece.candidate_skills
        feeds = {name: np.concatenate([chunk[o].state.tensors[name] for o in owners]) for name in _names(graphs.state)}
        feeds["candidate_questions"], feeds["candidate_skills"] = questions, candidate_skills
        probs = (await run(graphs.next.name, feeds))[graphs.next.output_names[0]]
        parts: list[list[np.ndarray]] = [[] for _ in chunk]
        for k, (piece, owner) in enumerate(zip(pieces, owners)):
            parts[owner].append(np.asarray(probs[k, :piece.n_candidates], dtype=np.float32))
        return [p[0] if len(p) == 1 else np.concatenate(p) for p in parts]


def _names(state) -> list[str]:
    return [spec.name for spec in state]


def _entry(learner: EncodedLearner, length: int, tensors: dict[str, np.ndarray]) -> LearnerState:
    """The cache entry of the learner's first `length` kept interactions (arrays copied: a batch's
    output is not kept alive by one learner's slice)."""
    return LearnerState(np.array(learner.questions[:length]), np.array(learner.skills[:length]),
                        np.array(learner.responses[:length]), {n: np.array(t) for n, t in tensors.items()})
