"""LearnerStates.observed (serving/state/learner_states.py), Observe's fill, over a fake step graph that
records what it was asked: a cached state advanced by the new answers (their ids, in order, after the
entry's), dropped when the window would slide or too many answers came, left to a Predict that replaced
the entry meanwhile (superseded), nothing without an entry."""
from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from routerkt.contract.step_signature import RECURRENT, STEP_GRAPHS, UPDATED
from serving.core.revision import Revision
from serving.encoder.window import EncodedLearner, WindowEncoder
from serving.state.cache import LearnerState, StateCache
from serving.state.learner_states import LearnerStates

pytestmark = pytest.mark.unit

MODEL = SimpleNamespace(name="m", version=1, window=8, step_state=RECURRENT, band=False)
STATE = [spec.name for spec in STEP_GRAPHS[RECURRENT].state]


def entry(n: int) -> LearnerState:
    return LearnerState(np.arange(2, 2 + n), np.full((n, 1), 3), np.ones(n, np.int64),
                        {name: np.full((1, 4), float(n), np.float32) for name in STATE})


def new(questions: list[int], skills: list[list[int]]) -> EncodedLearner:
    width = max(len(s) for s in skills)
    padded = np.array([s + [0] * (width - len(s)) for s in skills], np.int64)
    return EncodedLearner(np.array(questions, np.int64), padded, np.zeros(len(questions), np.int64),
                          np.zeros(0, np.int64), np.zeros((0, 1), np.int64))


class Steps:
    """step_append that adds 1 to every state value and records the appended questions."""

    def __init__(self, during=lambda: None) -> None:
        self.appended: list[int] = []
        self.during = during

    async def __call__(self, graph: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert graph == "step_append"
        self.appended += feeds["append_question"][:, 0].tolist()     # [batch, appended]: one at a time here
        self.during()
        return {UPDATED + name: feeds[name] + 1 for name in STATE}


def states(cache: StateCache) -> LearnerStates:
    return LearnerStates(cache, WindowEncoder())


def test_a_fill_appends_the_new_answers_after_the_entry_and_caches_the_result() -> None:
    cache = StateCache(1 << 20)
    cache.put("m", 1, "k", entry(3))
    run = Steps()
    assert asyncio.run(states(cache).observed(MODEL, "k", new([40, 41], [[5], [6, 7]]), run)) == "filled"
    filled = cache.get("m", 1, "k")
    assert run.appended == [40, 41] and filled.length == 5
    assert filled.questions.tolist() == [2, 3, 4, 40, 41]
    assert filled.skills.tolist() == [[3, 0], [3, 0], [3, 0], [5, 0], [6, 7]]
    assert float(filled.tensors[STATE[0]][0, 0]) == 5.0           # two appends on a state of 3


@pytest.mark.parametrize("held, arriving", [(6, 2), (2, 5)], ids=["window-would-slide", "past-max-appends"])
def test_a_fill_that_cannot_stay_exact_drops_the_entry(held: int, arriving: int) -> None:
    cache = StateCache(1 << 20)
    cache.put("m", 1, "k", entry(held))
    run = Steps()
    result = asyncio.run(states(cache).observed(MODEL, "k", new(list(range(arriving)), [[1]] * arriving), run))
    assert result == "dropped" and cache.get("m", 1, "k") is None and run.appended == []


def test_a_predict_that_replaced_the_entry_meanwhile_keeps_its_state() -> None:
    cache = StateCache(1 << 20)
    cache.put("m", 1, "k", entry(3))
    newer = entry(4)
    run = Steps(during=lambda: cache.put("m", 1, "k", newer))
    assert asyncio.run(states(cache).observed(MODEL, "k", new([40], [[5]]), run)) == "superseded"
    assert cache.get("m", 1, "k") is newer


def test_no_entry_no_fill() -> None:
    cache = StateCache(1 << 20)
    run = Steps()
    assert asyncio.run(states(cache).observed(MODEL, "k", new([40], [[5]]), run)) is None
    assert run.appended == [] and len(cache) == 0


def test_a_predict_settled_after_the_fill_in_flight_does_not_append_again() -> None:
    cache = StateCache(1 << 20)
    cache.put("m", 1, "k", entry(3))
    looked_up, calls = [], []
    paths = LearnerStates(cache, WindowEncoder(),
                          on_lookup=lambda model, kind, result: looked_up.append(result))
    output = STEP_GRAPHS[RECURRENT].next.output_names[0]

    async def run(graph: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        calls.append(graph)
        await asyncio.sleep(0.01)                          # the fill's step_append takes a while
        if graph == "step_append":
            return {UPDATED + name: feeds[name] + 1 for name in STATE}
        return {output: np.zeros(feeds["candidate_questions"].shape, np.float32)}

    async def scenario() -> None:
        fill = asyncio.create_task(paths.observed(MODEL, "k", new([40], [[5]]), run))
        paths.fill_started("k", fill)
        held = cache.get("m", 1, "k")
        history = EncodedLearner(np.append(held.questions, 40), np.vstack([held.skills, [[5]]]),
                                 np.append(held.responses, 0), np.array([7]), np.array([[2]]))
        await asyncio.sleep(0)                             # the fill has started
        await paths.settled("k", 5.0)                      # as the history source asks before it reads
        await paths.predict(MODEL, [paths.learner_keys_of("k")], [history], run, rows=4, candidates=4)
        assert await fill == "filled"

    asyncio.run(scenario())
    assert calls == ["step_append", "step_next"] and looked_up == ["hit"]


@pytest.mark.parametrize("stored_at, read_at", [(Revision(0, 3), Revision(0, 3)), (None, Revision(0, 3))],
                         ids=["same-revision", "revision-learnt"])
def test_a_hit_keeps_its_entry_object_unless_the_read_tells_it_a_new_revision(stored_at, read_at) -> None:
    cached = replace(entry(3), revision=stored_at)
    cache = StateCache(cached.nbytes + entry(2).nbytes)   # room for two entries
    cache.put("m", 1, "k", cached)
    cache.put("m", 1, "other", entry(2))                  # now the most recently used
    paths, calls = states(cache), []
    output = STEP_GRAPHS[RECURRENT].next.output_names[0]

    async def run(graph: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        calls.append(graph)
        return {output: np.full(feeds["candidate_questions"].shape, 0.25, np.float32)}

    nothing_new = EncodedLearner(np.zeros(0, np.int64), np.zeros((0, 1), np.int64), np.zeros(0, np.int64),
                                 np.array([7]), np.array([[2]]))
    probs = asyncio.run(paths.predict(MODEL, [paths.learner_keys_of("k")], [nothing_new], run, rows=4,
                                      candidates=4, read=[(cached, read_at)]))
    assert calls == ["step_next"] and probs[0].tolist() == [0.25]
    kept = cache.peek("m", 1, "k")
    assert kept.revision == read_at and (kept is cached) == (stored_at == read_at)
    cache.put("m", 1, "third", entry(2))                  # evicts the least recently used: not the hit
    assert cache.peek("m", 1, "other") is None and cache.peek("m", 1, "k") is kept
