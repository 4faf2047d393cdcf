"""StateCache (serving/state/cache.py): a byte budget kept by evicting the least recently used entry,
per model version, ForgetLearner dropping every version of a learner, and the prefix rule that decides
whether a cached state may be extended (skill sets compared whatever their padding)."""
from __future__ import annotations

import numpy as np
import pytest

from serving.state.cache import LearnerState, StateCache, same_sets

pytestmark = pytest.mark.unit


def state(n: int, nbytes: int = 1000, seed: int = 0) -> LearnerState:
    rng = np.random.default_rng(seed)
    return LearnerState(rng.integers(2, 50, n), rng.integers(2, 9, (n, 1)), rng.integers(0, 2, n),
                        {"state_keys": np.zeros((1, nbytes // 4), np.float32)})


def test_the_budget_evicts_the_least_recently_used_and_counts_it() -> None:
    evicted, sizes = [], []
    one = state(3).nbytes
    cache = StateCache(3 * one, on_evict=lambda model, n: evicted.append((model, n)),
                       on_size=lambda learners, nbytes: sizes.append((learners, nbytes)))
    for learner in "abc":
        cache.put("m", 1, learner, state(3))
    assert cache.get("m", 1, "a") is not None          # a is now the most recently used
    cache.put("m", 1, "d", state(3))
    assert cache.get("m", 1, "b") is None and cache.get("m", 1, "a") is not None
    assert evicted == [("m", 1)] and len(cache) == 3 and cache.nbytes == 3 * one == sizes[-1][1]
    cache.put("m", 1, "a", state(3))                   # a replaced: no eviction, same bytes
    assert evicted == [("m", 1)] and cache.nbytes == 3 * one


def test_versions_are_apart_forget_drops_every_one_and_an_entry_over_the_budget_is_not_kept() -> None:
    cache = StateCache(10 * state(3).nbytes)
    cache.put("m", 1, "a", state(3))
    cache.put("m", 2, "a", state(3, seed=1))
    cache.put("m", 1, "b", state(3))
    assert cache.get("m", 3, "a") is None
    assert not np.array_equal(cache.get("m", 1, "a").questions, cache.get("m", 2, "a").questions)
    assert cache.forget("a") == 2 and len(cache) == 1 and cache.get("m", 2, "a") is None
    cache.put("m", 1, "big", state(3, nbytes=100 * state(3).nbytes))
    assert cache.get("m", 1, "big") is None and len(cache) == 1
    assert StateCache(0).budget_bytes == 0


def test_an_entry_extends_only_a_history_it_is_the_prefix_of() -> None:
    entry = state(4)
    q, s, r = entry.questions, entry.skills, entry.responses
    more_q, more_s, more_r = np.append(q, 7), np.vstack([s, [[3]]]), np.append(r, 1)
    assert entry.extended_by(q, s, r) == 0
    assert entry.extended_by(more_q, more_s, more_r) == 1
    wide = np.hstack([more_s, np.zeros((5, 1), np.int64)])       # the same sets padded to two slots
    assert entry.extended_by(more_q, wide, more_r) == 1
    flipped = more_r.copy()
    flipped[0] = 1 - flipped[0]                                  # another first answer
    assert entry.extended_by(more_q, more_s, flipped) is None
    assert entry.extended_by(more_q[1:], more_s[1:], more_r[1:]) is None     # the window slid
    assert entry.extended_by(q[:3], s[:3], r[:3]) is None                   # shorter: forgotten, re-observed
    two = np.hstack([more_s, np.full((5, 1), 5)])
    assert entry.extended_by(more_q, two, more_r) is None                   # a set with another skill


def test_same_sets_ignores_padding_columns_only() -> None:
    a = np.array([[3, 0], [4, 5]])
    assert same_sets(a, np.array([[3, 0, 0], [4, 5, 0]]))
    assert not same_sets(a, np.array([[3], [4]]))
    assert same_sets(np.array([[3], [4]]), np.array([[3, 0], [4, 0]]))


def test_history_keys_find_the_entry_of_a_prefix_whatever_the_skill_padding() -> None:
    from serving.encoder.window import EncodedLearner, WindowEncoder
    from serving.state.learner_states import LearnerStates

    def learner(n: int, width: int = 1, flip: int | None = None) -> EncodedLearner:
        rng = np.random.default_rng(0)
        q, s, r = rng.integers(2, 50, 20)[:n], rng.integers(2, 9, (20, 1))[:n], rng.integers(0, 2, 20)[:n]
        if flip is not None:
            r = r.copy()
            r[flip] = 1 - r[flip]
        s = np.pad(s, ((0, 0), (0, width - 1)))
        return EncodedLearner(q, s, r, np.array([3]), np.array([[2]]))

    states = LearnerStates(StateCache(1 << 20), WindowEncoder(), max_appends=4)
    ten = states.history_keys(learner(10))
    assert ten.kind == "history" and ten.tried[0] == ten.store and len(ten.tried) == 5
    assert states.history_keys(learner(10, width=3)) == ten                    # padding columns do not count
    assert states.history_keys(learner(11)).tried[1] == ten.store               # one more answer: found
    assert states.history_keys(learner(14)).tried[4] == ten.store               # four more: still found
    assert ten.store not in states.history_keys(learner(15)).tried              # five: rebuilt
    assert states.history_keys(learner(10, flip=3)).store != ten.store          # another answer: another key
    assert len(states.history_keys(learner(2)).tried) == 3                      # down to the empty history
    assert not ten.store.startswith(tuple("0123456789abcdef"))                  # apart from learner hashes
