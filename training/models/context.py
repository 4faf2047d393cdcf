"""Per-forward sequence context: validity, padding-invariant positions and the attention masks.

Every backbone builds one `SequenceContext` from its inputs and hands it to each layer, so masks are
computed once per forward and never stored on a module. Sequences are LEFT-padded; a position is
valid where its skill id is not PAD_ID (the candidate position of a served request is valid too).

Two mask kinds (AKT's convention):
- CURRENT: query i sees keys j <= i (encoders: the interaction at i is part of the context);
- PAST:    query i sees keys j < i  (knowledge retriever: only earlier responses).
Padding keys are never visible, which makes every prediction independent of the amount of padding.
Rows that see no key at all (padding rows, and the first real position under PAST) are zeroed
after the softmax by the attention layer; they never get a uniform distribution over the window.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch
from torch import Tensor

from routerkt.contract.signature import PAD_ID

# Large negative logit for masked entries. Finite (not -inf) so that no row can become NaN;
# exp(NEG - max) underflows to exactly 0 in float32 and bfloat16.
NEG = -1e9


class MaskKind(enum.Enum):
    CURRENT = "current"  # j <= i
    PAST = "past"        # j < i


@dataclass
class SequenceContext:
    valid: Tensor        # [B, L] bool
    positions: Tensor    # [B, L] long, 0 at the first valid position (padding positions: 0)
    distance: Tensor     # [L, L] float, i - j
    _allow: dict = field(default_factory=dict)
    _bias: dict = field(default_factory=dict)

    @classmethod
    def build(cls, skills: Tensor) -> "SequenceContext":
        valid = skills != PAD_ID                                     # [B, L]
        positions = (valid.long().cumsum(1) - 1).clamp(min=0)        # [B, L]
        idx = torch.arange(skills.shape[1], device=skills.device)
        distance = (idx[:, None] - idx[None, :]).to(torch.float32)   # [L, L]
        return cls(valid=valid, positions=positions, distance=distance)

    @property
    def batch(self) -> int:
        return self.valid.shape[0]

    @property
    def length(self) -> int:
        return self.valid.shape[1]

    def allow(self, kind: MaskKind) -> Tensor:
        """[B, 1, L, L] bool: query i may attend to key j."""
        if kind not in self._allow:
            L = self.length
            offset = 0 if kind is MaskKind.CURRENT else -1
            causal = torch.ones(L, L, dtype=torch.bool, device=self.valid.device).tril(offset)   # [L, L]
            self._allow[kind] = causal[None, None] & self.valid[:, None, None, :]                # [B,1,L,L]
        return self._allow[kind]

    def has_key(self, kind: MaskKind) -> Tensor:
        """[B, 1, L, 1] bool: rows with at least one visible key."""
        key = ("has", kind)
        if key not in self._allow:
            self._allow[key] = self.allow(kind).any(-1, keepdim=True)
        return self._allow[key]

    def additive_mask(self, kind: MaskKind, dtype: torch.dtype) -> Tensor:
        """[B, 1, L, L] float: 0 where visible, NEG elsewhere; rows without keys are all 0 (their
        output is zeroed afterwards), so no softmax row is ever empty."""
        key = (kind, dtype)
        if key not in self._bias:
            allow = self.allow(kind) | ~self.has_key(kind)
            zero = torch.zeros((), dtype=dtype, device=self.valid.device)
            neg = torch.full((), NEG, dtype=dtype, device=self.valid.device)
            self._bias[key] = torch.where(allow, zero, neg)
        return self._bias[key]
