"""StateCache: the learners' step-graph states this gateway holds, bounded in bytes, least recently used out first.

An entry is keyed by (model, version, learner key): the keyed learner hash of serving/sessions/keys.py (never a
raw learner id), or for the prefix cache a hash of the kept history (serving/state/learner_states.py); a
version never reads another version's state. It holds the state tensors and the kept
history they were computed from (model ids), which is what makes a stale entry harmless: the state path
(serving/state/learner_states.py) uses an entry only when that history is a prefix of the learner's
current one, and otherwise rebuilds. ForgetLearner drops every entry of the learner (`forget`).
Entries are immutable (their arrays are never written), so two calls of one learner may read one entry
while a third replaces it. Accounting: each entry's bytes are the arrays' nbytes; `budget_bytes` 0 keeps nothing.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from routerkt.contract.signature import PAD_ID
from serving.core.revision import Revision
from serving.state.fingerprint import fingerprint

Key = tuple[str, int, str]            # (model, version, learner key)


@dataclass(frozen=True)
class LearnerState:
    """One learner's state for one model version, and the history it was computed from: the kept interactions
    themselves and, for a band model's state that covers more (its rolling buffer), the `offset` interactions
    before them as a fingerprint (serving/state/fingerprint.py), so the entry's size is bounded at any length."""

    questions: np.ndarray              # int64 [n] the kept history in model ids, oldest first
    skills: np.ndarray                 # int64 [n, K] its skill sets, PAD_ID in unused slots
    responses: np.ndarray              # int64 [n]
    tensors: dict[str, np.ndarray] = field(repr=False)    # the step graphs' state tensors, each [1, ...]
    offset: int = 0                    # interactions before the kept ones that the state covers (band models)
    prior: int = 0                     # their fingerprint
    revision: Revision | None = None   # the store's log the state covers (serving/core/revision.py): a Predict
                                       # by learner_id then reads only the events after it (sessions/history.py)
    held: int | None = None            # the key Triton holds the state under (serving/state/placement.py);
                                       # `tensors` then holds its state_length only

    @property
    def length(self) -> int:
        """Interactions the state covers."""
        return self.offset + int(self.questions.shape[0])

    @property
    def nbytes(self) -> int:
        return (self.questions.nbytes + self.skills.nbytes + self.responses.nbytes
                + sum(t.nbytes for t in self.tensors.values()))

    def extended_by(self, questions: np.ndarray, skills: np.ndarray, responses: np.ndarray) -> int | None:
        """How many interactions the history (questions [m], skills [m, K'], responses [m]) adds to this
        state's (m - n), or None when this state's history is not its prefix (a new event order, a
        window that slid, a forgotten and re-observed learner)."""
        n, k = self.length, self.offset
        if questions.shape[0] < n:
            return None
        if k and fingerprint(questions[:k], skills[:k], responses[:k]) != self.prior:
            return None
        if not (np.array_equal(questions[k:n], self.questions) and np.array_equal(responses[k:n], self.responses)
                and same_sets(skills[k:n], self.skills)):
            return None
        return int(questions.shape[0]) - n


def same_sets(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal skill sets row by row, whatever the PAD_ID columns each array was padded with."""
    width = max(a.shape[1], b.shape[1])
    if a.shape[1] != width and (b[:, a.shape[1]:] != PAD_ID).any():
        return False
    if b.shape[1] != width and (a[:, b.shape[1]:] != PAD_ID).any():
        return False
    common = min(a.shape[1], b.shape[1])
    return np.array_equal(a[:, :common], b[:, :common])


class StateCache:
    """(model, version, learner key) -> LearnerState, at most `budget_bytes` in all (LRU eviction)."""

    def __init__(self, budget_bytes: int, on_evict=lambda model, count: None,
                 on_size=lambda learners, nbytes: None) -> None:
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[Key, LearnerState] = OrderedDict()
        self._by_learner: dict[str, set[Key]] = {}
        self._bytes = 0
        self._on_evict = on_evict           # (model name, entries evicted): a metric
        self._on_size = on_size             # (entries, bytes) after every change: gauges

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, model: str, version: int, learner: str) -> LearnerState | None:
        """The entry (now the most recently used), or None."""
        key = (model, version, learner)
        state = self._entries.get(key)
        if state is not None:
            self._entries.move_to_end(key)
        return state

    def put(self, model: str, version: int, learner: str, state: LearnerState) -> None:
        """Store (or replace) the entry, then evict the least recently used ones beyond the budget; an
        entry larger than the whole budget is not kept."""
        key = (model, version, learner)
        self._drop(key)
        if state.nbytes > self.budget_bytes:
            self._report()
            return
        self._entries[key] = state
        self._by_learner.setdefault(learner, set()).add(key)
        self._bytes += state.nbytes
        evicted: dict[str, int] = {}
        while self._bytes > self.budget_bytes:
            oldest = next(iter(self._entries))
            self._drop(oldest)
            evicted[oldest[0]] = evicted.get(oldest[0], 0) + 1
        for name, count in evicted.items():
            self._on_evict(name, count)
        self._report()

    def peek(self, model: str, version: int, learner: str) -> LearnerState | None:
        """The entry, its place in the LRU order unchanged."""
        return self._entries.get((model, version, learner))

    def versions_of(self, learner: str) -> list[tuple[str, int]]:
        """(model, version) of each entry the learner has."""
        return sorted((key[0], key[1]) for key in self._by_learner.get(learner, ()))

    def discard(self, model: str, version: int, learner: str) -> None:
        """Drop one entry (if there is one)."""
        self._drop((model, version, learner))
        self._report()

    def forget(self, learner: str) -> int:
        """Drop every entry of the learner (every model and version); how many there were."""
        keys = list(self._by_learner.get(learner, ()))
        for key in keys:
            self._drop(key)
        self._report()
        return len(keys)

    def _drop(self, key: Key) -> None:
        state = self._entries.pop(key, None)
        if state is None:
            return
        self._bytes -= state.nbytes
        keys = self._by_learner.get(key[2])
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_learner[key[2]]

    def _report(self) -> None:
        self._on_size(len(self._entries), self._bytes)
