"""The step layout of `SequenceContext`: new query rows computed against a learner's cached key columns.

The attention backbones read every index-dependent fact through their context (context.py), so
their unchanged `compute` runs on new rows only when handed a `StepContext`:
- append (`StepContext.append`): k new history rows at window indices P..P+k-1 after P cached
  columns (left-padded, like a window); key columns are the P cached ones and the k new ones,
  in index order, under the usual CURRENT / PAST masks. Each attention layer's projected keys and
  values of the new rows are appended to its cache (`extend`), and the running prefix sums of the
  routers (RouterKT PREFIX routing) move on by the new rows (`prefix_sum`);
- candidates (`StepContext.candidates`): C candidate rows, each at window index P (where it sits in
  its own window [history, candidate]); key columns are the P cached ones and one more, each
  query's OWN slot, exactly as the rank layout's candidates (context.py). Nothing is stored.
A layer's cached columns are found by its attention layer's name; prefix sums by that name and
the order of the `prefix_sum` calls inside the layer (the router's numerator, then its count).
Band models (context `band` = W) keep only the last W - 1 columns (`LayerCache.last`): a row never
sees further back, so the rolling buffer is exact at any history length; `count` carries the number of
interactions before the buffer's end (positions are counted from the learner's first interaction).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from training.models.context import SequenceContext

KeyValues = tuple[Tensor, Tensor]      # projected keys, values [B, heads, P, d_k] of one attention layer


@dataclass
class LayerCache:
    """What the attention layers keep of a learner's P history positions (left-padded, P <= W - 1)."""

    valid: Tensor                                                  # [B, P] bool: the column holds an interaction
    keys: dict[str, KeyValues] = field(default_factory=dict)       # layer name -> (keys, values)
    sums: dict[str, list[Tensor]] = field(default_factory=dict)    # layer name -> running prefix sums [B, 1, E]
    count: Tensor | None = None     # [B, 1] long: interactions so far (None: the valid columns, nothing dropped)

    @property
    def width(self) -> int:
        return self.valid.shape[1]

    def seen(self) -> Tensor:
        """[B, 1] long: the learner's interactions so far (dropped columns included)."""
        return self.count if self.count is not None else self.valid.long().sum(1, keepdim=True)

    def last(self, width: int) -> "LayerCache":
        """The cache of the last `width` columns (a band model's rolling buffer); sums and count kept."""
        if self.width <= width:
            return self
        return LayerCache(valid=self.valid[:, -width:],
                          keys={n: (k[..., -width:, :], v[..., -width:, :]) for n, (k, v) in self.keys.items()},
                          sums=self.sums, count=self.seen())

    def nbytes(self) -> int:
        """Bytes of the cached tensors (keys, values, sums and the validity mask)."""
        tensors = [t for kv in self.keys.values() for t in kv] + [t for s in self.sums.values() for t in s]
        return sum(t.numel() * t.element_size() for t in tensors) + self.valid.numel()


@dataclass
class StepContext(SequenceContext):
    cache: LayerCache | None = None     # the columns before the query rows
    own: bool = False                   # candidate rows: the last key column is each query's own slot
    stored: LayerCache | None = None    # append: the cache grown by the new rows
    _layer: str = ""                    # the attention layer now running
    _calls: int = 0                     # prefix_sum calls made inside it so far

    @classmethod
    def append(cls, cache: LayerCache, valid: Tensor, band: int = 0) -> "StepContext":
        """k new rows, valid [B, k] (every one holds an interaction, or the first step's padding)."""
        P, k = cache.width, valid.shape[1]
        dev = valid.device
        rows, columns = torch.arange(P, P + k, device=dev), torch.arange(P + k, device=dev)
        distance = (rows[:, None] - columns[None, :]).to(torch.float32)                     # [k, P+k]
        seen = cache.seen()                                                                  # [B, 1]
        positions = (seen + valid.long().cumsum(1) - 1).clamp(min=0)                          # [B, k]
        grown = LayerCache(valid=torch.cat([cache.valid, valid], dim=1),                     # [B, P+k]
                           count=seen + valid.long().sum(1, keepdim=True))
        return cls(valid=valid, positions=positions, distance=distance, index=rows,
                   visible=torch.ones_like(distance, dtype=torch.bool), band=band, cache=cache, stored=grown)

    @classmethod
    def candidates(cls, cache: LayerCache, valid: Tensor, band: int = 0) -> "StepContext":
        """C candidate rows, valid [B, C] (padding candidates: False)."""
        P, C = cache.width, valid.shape[1]
        dev = valid.device
        to_history = (P - torch.arange(P, device=dev)).to(torch.float32)                    # [P]
        distance = torch.cat([to_history.expand(C, P), torch.zeros(C, 1, device=dev)], dim=1)   # [C, P+1]
        seen = cache.seen()                                                                  # [B, 1]
        return cls(valid=valid, positions=seen.expand(-1, C), distance=distance,
                   index=torch.full((C,), P, dtype=torch.long, device=dev),
                   visible=torch.ones_like(distance, dtype=torch.bool), band=band, cache=cache, own=True)

    @property
    def width(self) -> int:
        """P, the number of cached columns."""
        return self.cache.width

    @property
    def plain_keys(self) -> bool:
        return not self.own

    # -- the cached columns ----------------------------------------------------------------------
    def extend(self, name: str, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self._layer, self._calls = name, 0
        if name in self.cache.keys:
            old_k, old_v = self.cache.keys[name]
            k, v = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)                 # [B, h, P + rows, d]
        if self.stored is not None:
            self.stored.keys[name] = (k, v)
        return k, v

    def prefix_sum(self, x: Tensor) -> Tensor:
        """[B, rows, E] -> the sum of x over the learner's positions up to each row: the cached
        running sum plus the new rows up to it (append) or plus the row itself (candidates)."""
        sums = self.cache.sums.get(self._layer, [])
        carry = sums[self._calls] if self._calls < len(sums) else torch.zeros_like(x[:, :1])   # [B, 1, E]
        self._calls += 1
        if self.own:
            return carry + x
        out = carry + x.cumsum(1)
        if self.stored is not None:
            self.stored.sums.setdefault(self._layer, []).append(out[:, -1:])
        return out

    def history_only(self, encode: Callable[[Tensor, SequenceContext], Tensor], x: Tensor) -> Tensor:
        """Appended rows are history (encoded); a candidate's own value is never read (unchanged)."""
        return x if self.own else encode(x, self)

    def history(self) -> SequenceContext:
        raise ValueError("a step context has no history positions of its own")

    # -- index-dependent tables ------------------------------------------------------------------
    def table(self, full: Tensor) -> Tensor:
        """[..., Lmax, Lmax] table of (index_i, index_j) -> [..., rows, key columns]."""
        P = self.width
        if not self.own:
            first = P                                                                  # rows P..P+k-1
            return full[..., first:first + self.length, :P + self.length]
        rows = full[..., P:P + 1, :P].expand(*full.shape[:-2], self.length, P)         # [..., C, P]
        own = full[..., P:P + 1, P:P + 1].expand(*full.shape[:-2], self.length, 1)     # [..., C, 1]
        return torch.cat([rows, own], dim=-1)

    def key_table(self, full: Tensor) -> Tensor:
        raise ValueError("key_table: the step layout has per-query key columns (use table)")

    def restrict(self, weights: Tensor) -> Tensor:
        """Every key column may be seen by every row (masks decide), within the band."""
        return weights * self.in_band().to(weights.dtype) if self.band else weights

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        """q [B, h, rows, d], k [B, h, columns (append) or P + rows (candidates), d] -> [B, h, rows, K]."""
        if not self.own:
            return q @ k.transpose(-1, -2)
        P = self.width
        return torch.cat([q @ k[..., :P, :].transpose(-1, -2), (q * k[..., P:, :]).sum(-1, keepdim=True)], dim=-1)

    def apply(self, weights: Tensor, v: Tensor) -> Tensor:
        if not self.own:
            return weights @ v
        P = self.width
        return weights[..., :P] @ v[..., :P, :] + weights[..., P:] * v[..., P:, :]

    def later_keys(self, dtype: torch.dtype) -> Tensor:
        cols = torch.arange(self.distance.shape[1], device=self.distance.device)
        return (cols[:, None] > cols[None, :]).to(dtype)

    def key_valid(self) -> Tensor:
        """[B, 1 or rows, K] bool: key column j holds a real interaction (own column: the query's)."""
        if not self.own:
            return self.stored.valid[:, None, :]
        cached = self.cache.valid[:, None, :].expand(-1, self.length, -1)              # [B, C, P]
        return torch.cat([cached, self.valid[:, :, None]], dim=2)
