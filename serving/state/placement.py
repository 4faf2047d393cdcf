"""Where a learner's step-graph state lives between calls (a strategy of serving/state/learner_states.py):
- GATEWAY: the state tensors sit in the gateway's cache entry and travel with every step call (in process,
  and through a Triton whose config declares no held states);
- HELD: the Triton python model keeps them (routerkt/contract/step_signature.py, "Held states"); the entry
  keeps the state's key and length, and a step call carries the key and the new rows only.

A held key is random (55 bits) and never reused, so an entry's key names exactly the state computed for the
entry's history, or nothing: a key the model no longer holds (evicted, restarted, reloaded) fails the call
with StateLost and the caller rebuilds. Its low SLOT_BITS are the learner's slot, the same for every key of
that learner, which picks the Triton replica that holds it (serving/backends/triton/replica_set.py).
"""
from __future__ import annotations

import random
import zlib
from typing import TYPE_CHECKING

import numpy as np

from routerkt.contract.step_signature import KEEP_AS, STATE_LENGTH, STATE_REF, UPDATED, HeldGraphs, StepGraphs

if TYPE_CHECKING:
    from serving.state.cache import LearnerState

SLOT_BITS = 8
SLOT_MASK = (1 << SLOT_BITS) - 1
_random = random.SystemRandom()


class StateLost(Exception):
    """A step call named a held state the backend no longer holds: rebuild it."""


def slot_of(key: str) -> int:
    """The slot of a cache key (a learner's keyed hash, or a history hash): which replica holds its states."""
    return zlib.crc32(key.encode()) & SLOT_MASK


def held_slot(held: int) -> int:
    """The slot a held key was made in (its low SLOT_BITS): a new key of the same learner goes there too."""
    return held & SLOT_MASK


def slots(refs: np.ndarray) -> np.ndarray:
    """The slots of held keys (int64 [rows])."""
    return np.asarray(refs, dtype=np.int64) & SLOT_MASK


def _stacked(tensors: list[np.ndarray]) -> np.ndarray:
    """The learners' state tensors [1, ...] as one batch; one learner's as it is (entries are never written)."""
    return tensors[0] if len(tensors) == 1 else np.concatenate(tensors)


def _state_names(outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {n[len(UPDATED):] if n.startswith(UPDATED) else n: t for n, t in outputs.items()}


Kept = tuple[dict[str, np.ndarray], "int | None"]     # an entry's tensors [1, ...] and its held key


class GatewayPlace:
    """The state tensors travel with every call."""

    held = False

    def graphs(self, graphs: StepGraphs) -> StepGraphs | HeldGraphs:
        """The calls this place makes (`.start`, `.append`, `.next`)."""
        return graphs

    def state_feeds(self, graphs: StepGraphs, states: list[LearnerState]) -> dict[str, np.ndarray]:
        return {spec.name: _stacked([s.tensors[spec.name] for s in states]) for spec in graphs.state}

    def keep_feeds(self, keys: list[int]) -> dict[str, np.ndarray]:
        return {}

    def kept(self, outputs: dict[str, np.ndarray], feeds: dict[str, np.ndarray], k: int) -> Kept:
        """Learner k's new entry tensors (the state) from a start or append call's outputs."""
        return {n: t[k:k + 1] for n, t in _state_names(outputs).items()}, None


class HeldPlace:
    """The Triton python model holds the states; the entry keeps their keys and lengths."""

    held = True

    def graphs(self, graphs: StepGraphs) -> StepGraphs | HeldGraphs:
        return graphs.held

    def state_feeds(self, graphs: StepGraphs, states: list[LearnerState]) -> dict[str, np.ndarray]:
        return {STATE_LENGTH.name: _stacked([s.tensors[STATE_LENGTH.name] for s in states]),
                STATE_REF.name: np.array([s.held for s in states], dtype=np.int64)}

    def keep_feeds(self, slot: list[int]) -> dict[str, np.ndarray]:
        """New keys, one per learner, each in its learner's slot."""
        return {KEEP_AS.name: np.array([(_random.getrandbits(63 - SLOT_BITS) << SLOT_BITS) | s for s in slot],
                                       dtype=np.int64)}

    def kept(self, outputs: dict[str, np.ndarray], feeds: dict[str, np.ndarray], k: int) -> Kept:
        lengths = _state_names(outputs)[STATE_LENGTH.name]
        return {STATE_LENGTH.name: lengths[k:k + 1]}, int(feeds[KEEP_AS.name][k])


GATEWAY, HELD = GatewayPlace(), HeldPlace()
PLACES = {False: GATEWAY, True: HELD}          # held by the backend? -> the place
