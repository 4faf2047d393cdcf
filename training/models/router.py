"""RouterKT's router: token-wise scoring, top-K weighted voting and person-wise aggregation, plus the
load-balance loss. Used for attention heads (RouterKT) and for FFN experts (the ablation).

For E experts of which the first S are shared:
- gate g_t = softmax(W_g h_t) over the D = E - S dynamic experts              [B, L, D]
- top-K voting: s_t = g_t * onehot(topK(g_t)); selected gates keep their value (no renormalisation)
- token weights w_t = [1]*S ++ s_t                                            [B, L, E]
- aggregation by scope: TOKEN w_t; PREFIX mean of w over valid positions <= t (causal person-wise;
  in the rank layout a candidate's mean covers the history and itself, `SequenceContext.prefix_sum`);
  SEQUENCE mean over the whole window (the paper's; sees the future, for reproduction only).
- balance loss (per layer; the model sums layers): sum_i f_i * P_i with P_i the mean gate of expert i
  and f_i its share of the selections, both over valid tokens. f carries no gradient. With uniform
  routing it equals 1/D (the reference code's scale; no x D factor).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from training import distributed
from training.config import RoutingScope
from training.models.context import SequenceContext


@dataclass
class Routing:
    weights: Tensor        # [B, L, E] aggregated expert weights used by the layer ([B, 1, E] for SEQUENCE)
    token_weights: Tensor  # [B, L, E] per-token weights before aggregation
    selected: Tensor       # [B, L, D] 1.0 where a dynamic expert is selected
    balance: Tensor        # scalar load-balance loss of this layer


class Router(nn.Module):
    def __init__(self, d_model: int, n_experts: int, n_shared: int, n_selected: int, scope: RoutingScope):
        super().__init__()
        n_dynamic = n_experts - n_shared
        if not 0 <= n_shared < n_experts:
            raise ValueError(f"n_shared must be in [0, {n_experts - 1}], got {n_shared}")
        if not 1 <= n_selected <= n_dynamic:
            raise ValueError(f"n_selected must be in [1, {n_dynamic}], got {n_selected}")
        self.n_shared, self.n_dynamic, self.n_selected, self.scope = n_shared, n_dynamic, n_selected, scope
        self.gate = nn.Linear(d_model, n_dynamic, bias=False)

    def forward(self, h: Tensor, ctx: SequenceContext) -> Routing:
        # h: [B, L, d_model]
        gates = torch.softmax(self.gate(h).float(), dim=-1)                    # [B, L, D]
        top = gates.topk(self.n_selected, dim=-1).indices                     # [B, L, K]
        selected = torch.zeros_like(gates).scatter(-1, top, 1.0)              # [B, L, D]
        shared = torch.ones(*gates.shape[:2], self.n_shared, dtype=gates.dtype, device=gates.device)
        token = torch.cat([shared, gates * selected], dim=-1)                 # [B, L, E]

        valid = ctx.valid.to(gates.dtype).unsqueeze(-1)                        # [B, L, 1]
        if self.scope is RoutingScope.TOKEN:
            weights = token
        elif self.scope is RoutingScope.PREFIX:
            weights = ctx.prefix_sum(token * valid) / ctx.prefix_sum(valid).clamp(min=1.0)  # [B, L, E]
        else:  # SEQUENCE: whole-window mean, future positions included
            weights = (token * valid).sum(1, keepdim=True) / valid.sum(1, keepdim=True).clamp(min=1.0)  # [B, 1, E]

        n_valid = valid.sum().clamp(min=1.0)
        mean_gate = (gates * valid).sum((0, 1)) / n_valid                     # [D]
        counts = (selected * valid).sum((0, 1)).detach()                      # [D]
        if self.training:             # data-parallel training: the shares of the whole global batch
            counts = distributed.global_sum(counts)
        share = counts / counts.sum().clamp(min=1.0)                          # [D]
        balance = (share * mean_gate).sum()
        return Routing(weights=weights, token_weights=token, selected=selected, balance=balance)
