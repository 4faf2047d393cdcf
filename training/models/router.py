"""RouterKT's router: token-wise scoring, top-K weighted voting and person-wise aggregation, plus the
load-balance loss. Used for attention heads (RouterKT) and for FFN experts (the ablation).

For E experts of which the first S are shared:
- gate g_t over the D = E - S dynamic experts                                 [B, L, D]
  LEARNED:    softmax(W_g h_t)
  QUERY_NORM: softmax(n_t / std(n_t)) with n_{t,i} = ||h_t[head S+i]||_2, h_t the layer's projected
              query split into E heads; unbiased std over the D heads, floored at STD_FLOOR (equal
              norms -> uniform gates, where the reference divides by zero). No parameter; per token.
- top-K voting: s_t = g_t * onehot(topK(g_t)); selected gates keep their value (no renormalisation)
  (person_topk, PREFIX only: the top-K is taken on the prefix-mean gate instead, see below)
- token weights w_t = [1]*S ++ s_t                                            [B, L, E]
- aggregation by scope: TOKEN w_t; PREFIX mean of w over valid positions <= t (causal person-wise;
  in the rank layout a candidate's mean covers the history and itself, `SequenceContext.prefix_sum`);
  SEQUENCE mean over the whole window (the paper's; sees the future, for reproduction only).
  PREFIX with person_topk: G_t = mean of g over valid positions <= t, weights = [1]*S ++
  G_t * onehot(topK(G_t)): exactly K dynamic experts per person and position, chosen from the
  person's history up to t only (causal); token_weights are then [1]*S ++ g_t (no per-token top-K).
- balance loss (per layer; the model sums layers): sum_i f_i * P_i with P_i the mean gate of expert i
  and f_i its share of the selections, both over valid tokens. f carries no gradient. With uniform
  routing it equals 1/D (the reference code's scale; no x D factor).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from training import distributed
from training.config import RouterScoring, RoutingScope
from training.models.context import SequenceContext


@dataclass
class Routing:
    weights: Tensor        # [B, L, E] aggregated expert weights used by the layer ([B, 1, E] for SEQUENCE)
    token_weights: Tensor  # [B, L, E] per-token weights before aggregation
    selected: Tensor       # [B, L, D] 1.0 where a dynamic expert is selected
    balance: Tensor        # scalar load-balance loss of this layer


STD_FLOOR = 1e-6   # QUERY_NORM: smallest std the norms are divided by


def _top_k(scores: Tensor, k: int) -> Tensor:
    """[..., D] -> 1.0 at the k largest entries of the last axis, else 0."""
    return torch.zeros_like(scores).scatter(-1, scores.topk(k, dim=-1).indices, 1.0)


class Router(nn.Module):
    def __init__(self, d_model: int, n_experts: int, n_shared: int, n_selected: int, scope: RoutingScope,
                 scoring: RouterScoring = RouterScoring.LEARNED, person_topk: bool = False):
        super().__init__()
        n_dynamic = n_experts - n_shared
        if not 0 <= n_shared < n_experts:
            raise ValueError(f"n_shared must be in [0, {n_experts - 1}], got {n_shared}")
        if not 1 <= n_selected <= n_dynamic:
            raise ValueError(f"n_selected must be in [1, {n_dynamic}], got {n_selected}")
        if person_topk and scope is not RoutingScope.PREFIX:
            raise ValueError(f"person_topk needs routing_scope=prefix, got {scope.value}")
        if scoring is RouterScoring.QUERY_NORM and d_model % n_experts:
            raise ValueError(f"query_norm routing splits d_model {d_model} into {n_experts} heads: not divisible")
        self.n_shared, self.n_dynamic, self.n_selected, self.scope = n_shared, n_dynamic, n_selected, scope
        self.n_experts, self.scoring, self.person_topk = n_experts, scoring, person_topk
        self.gate = nn.Linear(d_model, n_dynamic, bias=False) if scoring is RouterScoring.LEARNED else None

    def scores(self, h: Tensor) -> Tensor:
        """[B, L, d_model] -> gates [B, L, D] (float32), from each token's own h only."""
        if self.gate is not None:
            return torch.softmax(self.gate(h).float(), dim=-1)
        B, L, d = h.shape
        heads = h.float().reshape(B, L, self.n_experts, d // self.n_experts)[:, :, self.n_shared:]  # [B, L, D, dk]
        norms = torch.linalg.vector_norm(heads, dim=-1)                      # [B, L, D]
        centred = norms - norms.mean(-1, keepdim=True)
        var = (centred * centred).sum(-1, keepdim=True) / max(self.n_dynamic - 1, 1)  # unbiased (D = 1: 0)
        std = var.clamp(min=STD_FLOOR ** 2).sqrt()                           # floored before sqrt: finite grad
        return torch.softmax(norms / std, dim=-1)

    def forward(self, h: Tensor, ctx: SequenceContext) -> Routing:
        # h: [B, L, d_model]
        gates = self.scores(h)                                                # [B, L, D]
        shared = torch.ones(*gates.shape[:2], self.n_shared, dtype=gates.dtype, device=gates.device)
        valid = ctx.valid.to(gates.dtype).unsqueeze(-1)                        # [B, L, 1]
        if self.person_topk:        # top-K of the person's prefix-mean gate, positions <= t only
            person = ctx.prefix_sum(gates * valid) / ctx.prefix_sum(valid).clamp(min=1.0)   # [B, L, D]
            selected = _top_k(person, self.n_selected)                        # [B, L, D]
            token = torch.cat([shared, gates], dim=-1)                        # [B, L, E]
            weights = torch.cat([shared, person * selected], dim=-1)          # [B, L, E]
            return Routing(weights=weights, token_weights=token, selected=selected,
                           balance=self._balance(gates, selected, valid))
        selected = _top_k(gates, self.n_selected)                             # [B, L, D]
        token = torch.cat([shared, gates * selected], dim=-1)                 # [B, L, E]

        if self.scope is RoutingScope.TOKEN:
            weights = token
        elif self.scope is RoutingScope.PREFIX:
            weights = ctx.prefix_sum(token * valid) / ctx.prefix_sum(valid).clamp(min=1.0)  # [B, L, E]
        else:  # SEQUENCE: whole-window mean, future positions included
            weights = (token * valid).sum(1, keepdim=True) / valid.sum(1, keepdim=True).clamp(min=1.0)  # [B, 1, E]
        return Routing(weights=weights, token_weights=token, selected=selected,
                       balance=self._balance(gates, selected, valid))

    def _balance(self, gates: Tensor, selected: Tensor, valid: Tensor) -> Tensor:
        n_valid = valid.sum().clamp(min=1.0)
        mean_gate = (gates * valid).sum((0, 1)) / n_valid                     # [D]
        counts = (selected * valid).sum((0, 1)).detach()                      # [D]
        if self.training:             # data-parallel training: the shares of the whole global batch
            counts = distributed.global_sum(counts)
        share = counts / counts.sum().clamp(min=1.0)                          # [D]
        return (share * mean_gate).sum()
