"""Attention biases that do not depend on the learner: ALiBi (FoLiBi) slopes and tables, and the
distance table used by the relative recency kernel. They are functions of the distance i - j only, so they are
precomputed for the maximum window and sliced to the actual length (which works for left-padded
windows because a top-left [L, L] block of an i - j table is itself an i - j table).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor


def alibi_slopes(n_heads: int) -> list[float]:
    """ALiBi head slopes m_h = 2^(-8h/H), h = 1..H, for H a power of two. Otherwise the slopes of
    the nearest lower power of two, completed with every other slope of twice that power."""
    def geometric(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]

    if n_heads < 1:
        raise ValueError("n_heads must be >= 1")
    if math.log2(n_heads).is_integer():
        return geometric(n_heads)
    closest = 2 ** math.floor(math.log2(n_heads))
    return geometric(closest) + geometric(2 * closest)[0::2][: n_heads - closest]


def distance_table(max_len: int) -> Tensor:
    """[max_len, max_len] float32 with entry (i, j) = i - j."""
    idx = torch.arange(max_len, dtype=torch.float32)
    return idx[:, None] - idx[None, :]


def alibi_table(n_heads: int, max_len: int) -> Tensor:
    """[H, max_len, max_len]: -m_h * (i - j), added to the logits before the softmax. Entries with
    j > i are masked anyway; they hold +m_h * (j - i) and are never visible."""
    slopes = torch.tensor(alibi_slopes(n_heads), dtype=torch.float32)   # [H]
    return -slopes[:, None, None] * distance_table(max_len)[None]       # [H, Lmax, Lmax]
