"""Multi-head attention with the four attention kinds and optional RouterKT head routing.

Kinds (one enum, `AttentionKind`), all with masks from `SequenceContext` and zeroed rows for
queries that see no key:
- STANDARD:  softmax(S + M) V, S = Q K^T / sqrt(d_k)
- ALIBI:     softmax(S - m_h (i - j) + M) V, slopes m_h = 2^(-8h/H), table precomputed for max_len
- RELATIVE:  [lam_h softmax(S + M) + (1 - lam_h) softmax(-|i - j| / tau_h + M)] V,
             lam_h = sigmoid(a_h), tau_h = softplus(b_h), both learned per head
- MONOTONIC: AKT's context-aware decay S' = S * clamp(exp(-theta_h * dist), 1e-5, 1e5) with
             dist = sqrt(|i - j| * sum of (detached) attention mass beyond j), theta_h = softplus(gamma_h);
             the gradient reaches S (so Q/K) and gamma (unlike the FoLiBi/RouterKT reference code).
Queries and keys share one projection (kq_same, as in AKT/RouterKT). With a `Router`, each head's
output is scaled by its routing weight before the output projection (RouterKT: all heads run).

STANDARD and ALIBI use the fused `scaled_dot_product_attention` unless attention maps are
requested; the explicit path computes the same thing (checked by a unit test).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from training.config import AttentionKind, ModelConfig
from training.models.biases import alibi_slopes, alibi_table, distance_table, recency_kernel
from training.models.context import NEG, MaskKind, SequenceContext
from training.models.outputs import Collector
from training.models.router import Router


class MultiHeadAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, routed: bool, name: str = ""):
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"d_model {cfg.d_model} is not divisible by n_heads {cfg.n_heads}")
        d, H = cfg.d_model, cfg.n_heads
        self.name, self.kind, self.n_heads, self.d_k = name, cfg.attention, H, d // H
        self.max_len, self.dropout, self.fused = cfg.max_len, cfg.attn_dropout, cfg.fused_attention
        self.qk = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.out = nn.Linear(d, d)
        self.router = Router(d, H, cfg.n_shared, cfg.n_selected, cfg.routing_scope) if routed else None
        if self.kind is AttentionKind.MONOTONIC:
            self.gamma = nn.Parameter(torch.empty(H, 1, 1))
            nn.init.xavier_uniform_(self.gamma)
        if self.kind is AttentionKind.ALIBI:
            self.register_buffer("bias_table", alibi_table(H, cfg.max_len), persistent=False)   # [H, Lmax, Lmax]
        if self.kind is AttentionKind.RELATIVE:
            tau0 = torch.tensor([1.0 / m for m in alibi_slopes(H)])        # start as ALiBi-like recency
            self.mix_logit = nn.Parameter(torch.zeros(H))                   # lam = 0.5 at start
            self.tau_raw = nn.Parameter(tau0 + torch.log(-torch.expm1(-tau0)))   # softplus^-1(tau0)
            self.register_buffer("bias_table", None, persistent=False)     # set by freeze_biases()

    # -- learner-independent biases --------------------------------------------------------------
    def freeze_biases(self) -> None:
        """Precompute the relative recency kernel as a constant [H, Lmax, Lmax] (for export)."""
        if self.kind is AttentionKind.RELATIVE:
            with torch.no_grad():
                tau = F.softplus(self.tau_raw)
                self.bias_table = recency_kernel(distance_table(self.max_len).to(tau.device), tau)

    def _table(self, L: int, ctx: SequenceContext) -> Tensor:
        """[H, L, L] learner-independent logits for ALIBI / RELATIVE."""
        if self.bias_table is not None:
            return self.bias_table[:, :L, :L]
        return recency_kernel(ctx.distance, F.softplus(self.tau_raw))

    def _monotonic(self, scores: Tensor, allow: Tensor, ctx: SequenceContext) -> Tensor:
        # scores: [B, H, L, L]; allow: [B, 1, L, L]
        s = scores.detach().float()
        p = torch.softmax(s.masked_fill(~allow, NEG), dim=-1) * allow       # rows w/o keys -> 0
        # mass strictly beyond key j, summed from the right end (masked future first, left padding
        # last) so it is exactly 0 at the last visible key and independent of the padding amount
        remaining = p.flip(-1).cumsum(-1).flip(-1) - p                      # [B, H, L, L]
        dist = (remaining * ctx.distance.abs()).clamp(min=0.0).sqrt()       # detached
        theta = F.softplus(self.gamma.float())                              # [H, 1, 1]
        effect = torch.exp(-theta * dist).clamp(1e-5, 1e5)
        return scores * effect.to(scores.dtype)

    # -- forward -----------------------------------------------------------------------------------
    def forward(self, query: Tensor, key: Tensor, value: Tensor, ctx: SequenceContext,
                mask: MaskKind, collect: Collector) -> Tensor:
        # query/key/value: [B, L, d]
        B, L, d = query.shape
        H, dk = self.n_heads, self.d_k
        qp = self.qk(query)                                                   # [B, L, d]
        kp = qp if key is query else self.qk(key)
        q = qp.view(B, L, H, dk).transpose(1, 2)                              # [B, H, L, dk]
        k = kp.view(B, L, H, dk).transpose(1, 2)
        v = self.v(value).view(B, L, H, dk).transpose(1, 2)
        has_key = ctx.has_key(mask)                                           # [B, 1, L, 1]
        explicit = not self.fused or collect.want_attention or self.kind in (AttentionKind.MONOTONIC, AttentionKind.RELATIVE)
        drop = self.dropout if self.training else 0.0

        if not explicit:
            # attention itself runs in float32 even under bf16 autocast: the CPU flash kernel's
            # bf16 backward is ~3x slower than its float32 one here (projections stay bf16)
            q, k, v = q.float(), k.float(), v.float()
            bias = ctx.additive_mask(mask, torch.float32)                     # [B, 1, L, L]
            if self.kind is AttentionKind.ALIBI:
                bias = bias + self._table(L, ctx)                             # [B, H, L, L]
            if torch.is_autocast_enabled("cpu"):
                with torch.autocast("cpu", enabled=False):
                    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=drop)
            else:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=drop)
            out = out * has_key                                               # [B, H, L, dk]
        else:
            allow = ctx.allow(mask)                                           # [B, 1, L, L]
            scores = q @ k.transpose(-1, -2) / math.sqrt(dk)                  # [B, H, L, L]
            if self.kind is AttentionKind.ALIBI:
                scores = scores + self._table(L, ctx).to(scores.dtype)
            elif self.kind is AttentionKind.MONOTONIC:
                scores = self._monotonic(scores, allow, ctx)
            probs = torch.softmax(scores.masked_fill(~allow, NEG), dim=-1) * has_key
            if self.kind is AttentionKind.RELATIVE:
                kernel = self._table(L, ctx).to(scores.dtype)[None]           # [1, H, L, L]
                recency = torch.softmax(kernel.masked_fill(~allow, NEG), dim=-1) * has_key
                lam = torch.sigmoid(self.mix_logit).to(scores.dtype)[None, :, None, None]
                probs = lam * probs + (1.0 - lam) * recency
            if collect.want_attention:
                collect.attention.append(probs.detach())
                collect.names.append(self.name)
            out = F.dropout(probs, drop, self.training) @ v                  # [B, H, L, dk]

        if self.router is not None:
            routing = self.router(qp, ctx)
            weights = routing.weights.transpose(1, 2).unsqueeze(-1)            # [B, H, L or 1, 1]
            out = out * weights.to(out.dtype)
            collect.balance.append(routing.balance)
            if collect.want_routing:
                collect.routing.append(routing.weights.detach())
        out = out.transpose(1, 2).reshape(B, L, d)                            # [B, L, d]
        return self.out(out)
