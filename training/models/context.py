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
- window (`build`): position t of the tensor is index t of the window; keys are the L positions
  ([L, L] pair tables);
- rank (`build_rank`): H history positions, then N candidates. Every candidate has the window index
  H (where it sits in its own window [history, candidate]) and sees the history and itself, never
  another candidate. Key columns are the H history positions and one more, each query's OWN slot
  ([L, H + 1] pair tables; `scores`, `apply`): a candidate's scores cost H + 1, not H + N, and no
  [L, L] table is built. Masks, distances, positions and prefix sums are those of its own window,
  so one forward over H + N positions gives exactly the N window results (the model is causal).
  `history()` is the window context of the history alone, for value streams that only PAST-masked
  queries read (a candidate's own value is never visible to anyone there, so it needs no encoding).
Band models (ModelConfig.context=band) set `band` = W: a query may also see only keys at most W - 1
positions before it (`allow`, `restrict`), on every layout; a window model has band 0 (no such limit).
Layers read index-dependent facts only through the context (`distance`, `table`, `key_table`,
`restrict`, `prefix_sum`, `scores`, `apply`, `later_keys`) and get their key columns from it
(`extend`), so they work unchanged on both layouts and on the step layout of
training/models/step_context.py (new rows against a learner's cached columns).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable

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
    distance: Tensor     # [L, K] float, index_i - index of key column j (window: K = L; rank: K = H + 1)
    index: Tensor | None = None     # rank layout: [L] long window index of each position (None: 0..L-1)
    visible: Tensor | None = None   # rank layout: [L, H + 1] bool, key column j may be seen by query i at all
    band: int = 0                   # band models: keys more than band - 1 positions back are never visible
    _allow: dict = field(default_factory=dict)
    _bias: dict = field(default_factory=dict)

    @classmethod
    def build(cls, skills: Tensor, band: int = 0) -> "SequenceContext":
        valid = present(skills)                                      # [B, L]; skills [B, L, K]
        positions = (valid.long().cumsum(1) - 1).clamp(min=0)        # [B, L]
        idx = torch.arange(skills.shape[1], device=skills.device)
        distance = (idx[:, None] - idx[None, :]).to(torch.float32)   # [L, L]
        return cls(valid=valid, positions=positions, distance=distance, band=band)

    @classmethod
    def build_rank(cls, history_skills: Tensor, candidate_skills: Tensor, band: int = 0) -> "SequenceContext":
        """history_skills [B, H, K] (left-padded), candidate_skills [B, N, K] -> context over H + N
        queries and H + 1 key columns."""
        H, N = history_skills.shape[1], candidate_skills.shape[1]
        dev = history_skills.device
        history_valid = present(history_skills)                                   # [B, H]
        valid = torch.cat([history_valid, present(candidate_skills)], dim=1)      # [B, H+N]
        history_pos = (history_valid.long().cumsum(1) - 1).clamp(min=0)           # [B, H]
        seen = history_valid.long().sum(1, keepdim=True)                          # [B, 1]
        positions = torch.cat([history_pos, seen.expand(-1, N)], dim=1)            # [B, H+N]
        steps = torch.arange(H + N, device=dev)                                    # [H+N]
        index = steps.clamp(max=H)                                                 # 0..H-1, then H
        columns = torch.arange(H, device=dev)                                      # [H] history keys
        distance = torch.cat([index[:, None] - columns[None, :],                   # [H+N, H]
                              torch.zeros_like(index)[:, None]], dim=1).to(torch.float32)   # own slot: 0
        own = (steps >= H)[:, None]                                                # [H+N, 1]: a candidate's own key
        visible = torch.cat([torch.ones_like(distance[:, :-1], dtype=torch.bool), own], dim=1)   # [H+N, H+1]
        return cls(valid=valid, positions=positions, distance=distance, index=index, visible=visible, band=band)

    @property
    def rank(self) -> bool:
        return self.visible is not None

    @property
    def plain_keys(self) -> bool:
        """Key columns every query shares, scored by one product q k^T (the window layout; a step
        context's appended rows): what a fused attention kernel takes. The rank and candidate layouts'
        own slot is per query."""
        return not self.rank

    def _h(self) -> int:
        """The rank layout's history length H (symbolic under export)."""
        return self.distance.shape[1] - 1

    def history(self) -> "SequenceContext":
        """The window context of the rank layout's history positions alone (the window layout: itself)."""
        if not self.rank:
            return self
        H = self._h()
        idx = torch.arange(H, device=self.valid.device)
        distance = (idx[:, None] - idx[None, :]).to(torch.float32)                 # [H, H]
        return SequenceContext(valid=self.valid[:, :H], positions=self.positions[:, :H], distance=distance,
                               band=self.band)

    def history_only(self, encode: Callable[[Tensor, "SequenceContext"], Tensor], x: Tensor) -> Tensor:
        """encode(x, ctx) on the history positions alone in the rank layout, the candidates' rows of x
        kept as they are (window layout: encode(x, self)). For a value stream that only PAST-masked
        queries read: no query sees a candidate's own value there, so encoding it is wasted work."""
        if not self.rank:
            return encode(x, self)
        H = self._h()
        return torch.cat([encode(x[:, :H], self.history()), x[:, H:]], dim=1)

    @property
    def batch(self) -> int:
        return self.valid.shape[0]

    @property
    def length(self) -> int:
        return self.valid.shape[1]

    def extend(self, name: str, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """The key and value columns of attention layer `name` from its projected k, v [B, h, L, d]:
        these layouts have no others (unchanged); a step context (training/models/step_context.py)
        puts the cached columns of earlier positions before them."""
        return k, v

    # -- index-dependent tables ------------------------------------------------------------------
    def table(self, full: Tensor) -> Tensor:
        """[..., Lmax, Lmax] table of a function of (index_i, index_j) -> [..., L, K]."""
        if not self.rank:
            L = self.length
            return full[..., :L, :L]
        rows = full.index_select(-2, self.index)                                  # [..., L, Lmax]
        own = torch.diagonal(full, 0, -2, -1).index_select(-1, self.index)         # [..., L]: (index_i, index_i)
        return torch.cat([rows[..., : self._h()], own.unsqueeze(-1)], dim=-1)     # [..., L, H+1]

    def key_table(self, full: Tensor) -> Tensor:
        """[..., Lmax] key table whose last entry belongs to the window's last index -> [..., L]
        (window layout only: the rank layout's own column has a per-query index)."""
        if self.rank:
            raise ValueError("key_table: the rank layout has no per-key table (use table)")
        return full[..., -self.length:]

    def restrict(self, weights: Tensor) -> Tensor:
        """Zero [..., L, K] pair weights of keys a query may never see (a history row's own column, keys
        beyond the band)."""
        weights = weights * self.visible.to(weights.dtype) if self.rank else weights
        return weights * self.in_band().to(weights.dtype) if self.band else weights

    def in_band(self) -> Tensor:
        """[L, K] bool: key column j is at most band - 1 positions before query i (all True without a band)."""
        return self.distance <= (self.band - 1 if self.band else float("inf"))

    def prefix_sum(self, x: Tensor) -> Tensor:
        """[B, L, E] -> sum of x over the positions of each query's window up to itself."""
        if not self.rank:
            return x.cumsum(1)
        H = self._h()
        history = x[:, :H]                                                         # [B, H, E]
        return torch.cat([history.cumsum(1), history.sum(1, keepdim=True) + x[:, H:]], dim=1)

    # -- the attention product -------------------------------------------------------------------
    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        """q, k [B, h, L, d] -> [B, h, L, K] products of each query with its key columns."""
        if not self.rank:
            return q @ k.transpose(-1, -2)
        H = self._h()
        return torch.cat([q @ k[..., :H, :].transpose(-1, -2), (q * k).sum(-1, keepdim=True)], dim=-1)

    def apply(self, weights: Tensor, v: Tensor) -> Tensor:
        """weights [.., L, K] over the key columns, v [B, h, L, d] per position -> [B, h, L, d]."""
        if not self.rank:
            return weights @ v
        H = self._h()
        return weights[..., :H] @ v[..., :H, :] + weights[..., H:] * v

    def later_keys(self, dtype: torch.dtype) -> Tensor:
        """[K, K] 1.0 where key column j' comes after key column j in the window (j' > j)."""
        if not self.rank:
            return (self.distance > 0).to(dtype)
        cols = torch.arange(self.distance.shape[1], device=self.distance.device)
        return (cols[:, None] > cols[None, :]).to(dtype)

    def key_valid(self) -> Tensor:
        """[B, 1 or L, K] bool: key column j holds a real interaction (for the own column: the query's)."""
        if not self.rank:
            return self.valid[:, None, :]
        H, L = self._h(), self.length
        return torch.cat([self.valid[:, None, :H].expand(-1, L, -1), self.valid[:, :, None]], dim=2)

    # -- masks -----------------------------------------------------------------------------------
    def allow(self, kind: MaskKind) -> Tensor:
        """[B, 1, L, K] bool: query i may attend to key column j."""
        if kind not in self._allow:
            causal = self.distance >= (0.0 if kind is MaskKind.CURRENT else 1.0)                 # [L, K]
            if self.rank:
                causal = causal & self.visible
            if self.band:
                causal = causal & self.in_band()
            self._allow[kind] = causal[None, None] & self.key_valid()[:, None]                 # [B,1,L,K]
        return self._allow[kind]

    def has_key(self, kind: MaskKind) -> Tensor:
        """[B, 1, L, 1] bool: rows with at least one visible key."""
        key = ("has", kind)
        if key not in self._allow:
            self._allow[key] = self.allow(kind).any(-1, keepdim=True)
        return self._allow[key]

    def additive_mask(self, kind: MaskKind, dtype: torch.dtype) -> Tensor:
        """[B, 1, L, K] float: 0 where visible, NEG elsewhere; rows without keys are all 0 (their
        output is zeroed afterwards), so no softmax row is ever empty."""
        key = (kind, dtype)
        if key not in self._bias:
            allow = self.allow(kind) | ~self.has_key(kind)
            zero = torch.zeros((), dtype=dtype, device=self.valid.device)
            neg = torch.full((), NEG, dtype=dtype, device=self.valid.device)
            self._bias[key] = torch.where(allow, zero, neg)
        return self._bias[key]
