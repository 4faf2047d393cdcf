"""A 64-bit fingerprint of an interaction sequence that extends without the sequence: fp(a + b) from fp(a) and b.

A band model's cached state covers a learner's whole history, but its entry keeps only the last W - 1
interactions (serving/state/cache.py); the ones before are checked by this fingerprint. Each row (question,
response, skill set) is mixed into 64 bits; the sequence's fingerprint is the polynomial sum of its rows'
hashes, Horner's rule mod 2^64, so fp(a + b) = fp(a) * P^len(b) + fp(b) (`extend`). A skill set's unused
PAD_ID (0) slots add nothing, so the width it was padded to does not count. Not cryptographic: it tells a
learner's own history from a changed one (a chance collision: 2^-64).
"""
from __future__ import annotations

import numpy as np

P = np.uint64(0x9E3779B97F4A7C15)            # odd multiplier of the polynomial
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def row_hashes(questions: np.ndarray, skills: np.ndarray, responses: np.ndarray) -> np.ndarray:
    """uint64 [n]: one hash per interaction (questions, responses [n]; skill sets [n, K], PAD_ID 0 unused)."""
    with np.errstate(over="ignore"):
        q = _mix(questions.astype(np.uint64) * np.uint64(3) + responses.astype(np.uint64))
        slots = np.arange(1, skills.shape[1] + 1, dtype=np.uint64) << np.uint64(40)     # slot j -> its own range
        s = np.where(skills != 0, _mix(skills.astype(np.uint64) + slots[None, :]), np.uint64(0))
        return _mix(q ^ s.sum(axis=1, dtype=np.uint64))


def _power(n: int) -> np.uint64:
    return np.uint64(pow(int(P), n, 1 << 64))


def fingerprint(questions: np.ndarray, skills: np.ndarray, responses: np.ndarray) -> int:
    """The fingerprint of a whole sequence (0 for none)."""
    return extend(0, questions, skills, responses)


def extend(prior: int, questions: np.ndarray, skills: np.ndarray, responses: np.ndarray) -> int:
    """fp(a + b) from prior = fp(a) and the rows of b."""
    n = int(questions.shape[0])
    if n == 0:
        return prior
    with np.errstate(over="ignore"):
        powers = _powers(n)
        total = (row_hashes(questions, skills, responses) * powers).sum(dtype=np.uint64)
        return int(np.uint64(prior) * _power(n) + total)


def _powers(n: int) -> np.ndarray:
    """P^(n-1), ..., P, 1 (uint64, mod 2^64)."""
    with np.errstate(over="ignore"):
        up = np.cumprod(np.full(n, P, dtype=np.uint64), dtype=np.uint64)          # P^1 .. P^n
    return np.concatenate([up[:-1][::-1], np.ones(1, dtype=np.uint64)])
