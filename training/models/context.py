"""Per-forward sequence context: validity, padding-invariant positions and the attention masks.

Every backbone builds one `SequenceContext` from its inputs and hands it to each layer, so masks are
computed once per forward and never stored on a module. Sequences are LEFT-padded; a position is
valid where its skill set is not empty (any slot not PAD_ID) (the candidate position of a served request is valid too).

Two mask kinds (AKT's convention):
- CURRENT: query i sees keys j <= i (encoders: the interaction at i is part of the context);
- PAST:    query i sees keys j < i  (knowledge retriever: only earlier responses).
Padding keys are never visible, which makes every prediction independent of the amount of padding.
Rows that see no key at all (padding rows, and the first real position under PAST) are zeroed
after the softmax by the attention layer; they never get a uniform distribution over the window.

Two layouts:
- window (`build`): position t of the tensor is index t of the window;
- rank (`build_rank`): H history positions, then N candidates. Every candidate has the window index
  H (where it sits in its own window [history, candidate]) and sees the history and itself, never
  another candidate. Masks, distances, positions and prefix sums are those of its own window, so one
  forward over H + N positions gives exactly the N window results (the model is causal).
Layers read index-dependent facts only through the context (`distance`, `table`, `key_table`,
`restrict`, `prefix_sum`), so they work unchanged on both layouts.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch
from torch import Tensor

from training.models.skill_sets import present

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
    distance: Tensor     # [L, L] float, index_i - index_j (window indices)
    index: Tensor | None = None     # rank layout: [L] long window index of each position (None: 0..L-1)
    visible: Tensor | None = None   # rank layout: [L, L] bool, key j may be seen by query i at all
    _allow: dict = field(default_factory=dict)
    _bias: dict = field(default_factory=dict)

    @classmethod
    def build(cls, skills: Tensor) -> "SequenceContext":
        valid = present(skills)                                      # [B, L]; skills [B, L, K]
        positions = (valid.long().cumsum(1) - 1).clamp(min=0)        # [B, L]
        idx = torch.arange(skills.shape[1], device=skills.device)
        distance = (idx[:, None] - idx[None, :]).to(torch.float32)   # [L, L]
        return cls(valid=valid, positions=positions, distance=distance)

    @classmethod
    def build_rank(cls, history_skills: Tensor, candidate_skills: Tensor) -> "SequenceContext":
        """history_skills [B, H, K] (left-padded), candidate_skills [B, N, K] -> context over H + N."""
        H, N = history_skills.shape[1], candidate_skills.shape[1]
        dev = history_skills.device
        history_valid = present(history_skills)                                   # [B, H]
        valid = torch.cat([history_valid, present(candidate_skills)], dim=1)      # [B, H+N]
        history_pos = (history_valid.long().cumsum(1) - 1).clamp(min=0)           # [B, H]
        seen = history_valid.long().sum(1, keepdim=True)                          # [B, 1]
        positions = torch.cat([history_pos, seen.expand(-1, N)], dim=1)            # [B, H+N]
        steps = torch.arange(H + N, device=dev)                                    # [H+N]
        index = steps.clamp(max=H)                                                 # 0..H-1, then H
        distance = (index[:, None] - index[None, :]).to(torch.float32)             # [H+N, H+N]
        visible = (steps[None, :] < H) | (steps[:, None] == steps[None, :])        # history keys, or self
        return cls(valid=valid, positions=positions, distance=distance, index=index, visible=visible)

    @property
    def batch(self) -> int:
        return self.valid.shape[0]

    @property
    def length(self) -> int:
        return self.valid.shape[1]

    # -- index-dependent tables ------------------------------------------------------------------
    def table(self, full: Tensor) -> Tensor:
        """[..., Lmax, Lmax] table of a function of (index_i, index_j) -> [..., L, L]."""
        if self.index is None:
            L = self.length
            return full[..., :L, :L]
        return full.index_select(-2, self.index).index_select(-1, self.index)

    def key_table(self, full: Tensor) -> Tensor:
        """[..., Lmax] key table whose last entry belongs to the window's last index -> [..., L]."""
        if self.index is None:
            return full[..., -self.length:]
        span = self.index[-1] + 1                                  # the rank layout's window length H + 1
        return full.index_select(-1, self.index + (full.shape[-1] - span))

    def restrict(self, weights: Tensor) -> Tensor:
        """Zero [..., L, L] pair weights of keys a query may never see (other candidates)."""
        return weights if self.visible is None else weights * self.visible.to(weights.dtype)

    def prefix_sum(self, x: Tensor) -> Tensor:
        """[B, L, E] -> sum of x over the positions of each query's window up to itself."""
        if self.visible is None:
            return x.cumsum(1)
        upto = ((self.distance >= 0) & self.visible).to(x.dtype)                  # [L, L]
        return torch.einsum("ij,bje->bie", upto, x)

    # -- masks -----------------------------------------------------------------------------------
    def allow(self, kind: MaskKind) -> Tensor:
        """[B, 1, L, L] bool: query i may attend to key j."""
        if kind not in self._allow:
            causal = self.distance >= (0.0 if kind is MaskKind.CURRENT else 1.0)                 # [L, L]
            if self.visible is not None:
                causal = causal & self.visible
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
