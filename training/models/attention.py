"""Multi-head attention with the four attention kinds and optional RouterKT head routing.

Kinds (one enum, `AttentionKind`), all with masks from `SequenceContext` (M: 0 visible, NEG not)
and zeroed rows for queries that see no key. S = Q K^T / sqrt(d_k).
- STANDARD:  softmax(S + M) V
- ALIBI:     softmax(S - m_h (i - j) + M) V, slopes m_h = 2^(-8h/H)
- RELATIVE:  lam_h softmax(S + M) V + (1 - lam_h) softmax(-|i - j| / tau_h + M) V,
             lam_h = sigmoid(a_h), tau_h = softplus(b_h), both learned per head
- MONOTONIC: AKT's context-aware decay softmax(S * clamp(exp(-theta_h * dist), 1e-5) + M) V with
             dist = sqrt(|i - j| * attention mass beyond key j), the mass from the (detached)
             softmax(S + M); theta_h = softplus(gamma_h). The gradient reaches S (so Q/K) and gamma,
             unlike the FoLiBi/RouterKT reference code.
Queries and keys share one projection (kq_same, as in AKT/RouterKT). With a `Router`, each head's
output is scaled by its routing weight before the output projection (RouterKT: every head runs).

Inference cost: biases that do not depend on the learner add no [B, H, L, L] work.
- ALiBi: under a row softmax -m_h (i - j) equals m_h (j - (L - 1)) (a row constant cancels), a bias
  on keys only, folded into the product as one extra query/key channel: [q, 1] . [k, m_h (j-L+1) sqrt(d_k)].
- Relative: softmax(-|i - j| / tau + M) V = (K (V * valid)) / (K valid) with K[h, i, j] =
  exp(-(distance to j minus distance to the nearest visible key) / tau_h) on visible (i, j), a
  [H, L, L] constant at inference: two small matmuls, no softmax over [B, H, L, L].
- Tables for 2 max_len (cached columns and a chunk of appended rows), sliced to L
  (gathered at the window indices in the rank layout, see
  `SequenceContext.table`): the ALiBi ones (`alibi`, `alibi_keys`) are fixed buffers built
  in `__init__`; the relative kernel depends on the learned tau_h, so training computes it in each
  forward pass and `freeze_biases()` (before export) turns it into [H, Lmax, Lmax] constants, one
  per mask kind.
The explicit path (attention maps requested, fused_attention off, or the rank and candidate layouts,
whose [L, H + 1] key columns no fused kernel takes) materialises the probabilities; a unit test checks
that both paths agree. A step context's appended rows (band models' chunks) take the fused kernel with
their [L, P + L] mask (ALiBi's table added to it).
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from training.config import AttentionKind, ModelConfig
from training.models.biases import alibi_slopes, alibi_table, distance_table
from training.models.context import MaskKind, SequenceContext
from training.models.outputs import Collector
from training.models.router import Router


def _float32():
    """Attention runs in float32, also under bf16 autocast (the CPU flash kernel's bf16 backward is
    ~3x slower than its float32 one here, and the decay maths wants the precision); the
    projections around it stay bf16."""
    return torch.autocast("cpu", enabled=False) if torch.is_autocast_enabled("cpu") else contextlib.nullcontext()


def recency_weights(distance: Tensor, tau: Tensor, mask: MaskKind) -> Tensor:
    """[H, L, L] unnormalised recency attention: exp(-(i - j - s) / tau_h) on visible (i, j), else 0,
    with s = 0 (CURRENT) or 1 (PAST) so the nearest visible key weighs exactly 1."""
    shift = 0.0 if mask is MaskKind.CURRENT else 1.0
    d = distance - shift                                                     # [L, L]
    weights = torch.exp(-d.clamp(min=0.0)[None] / tau[:, None, None])        # [H, L, L]
    return weights * (d >= 0).to(weights.dtype)


class MultiHeadAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, routed: bool, name: str = "", kind: AttentionKind | None = None):
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"d_model {cfg.d_model} is not divisible by n_heads {cfg.n_heads}")
        d, H = cfg.d_model, cfg.n_heads
        self.name, self.kind, self.n_heads, self.d_k = name, kind or cfg.attention, H, d // H
        self.max_len, self.dropout, self.fused = cfg.table_len, cfg.attn_dropout, cfg.fused_attention
        self.recompute = cfg.recompute_attention
        self.qk = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.out = nn.Linear(d, d)
        self.router = Router(d, H, cfg.n_shared, cfg.n_selected, cfg.routing_scope, scoring=cfg.router_scoring,
                             person_topk=cfg.person_topk) if routed else None
        if self.kind is AttentionKind.MONOTONIC:
            self.gamma = nn.Parameter(torch.empty(H, 1, 1))
            nn.init.xavier_uniform_(self.gamma)
        if self.kind is AttentionKind.ALIBI:
            slopes = torch.tensor(alibi_slopes(H))
            self.register_buffer("alibi", alibi_table(H, self.max_len), persistent=False)     # [H, Lmax, Lmax]
            key_pos = torch.arange(self.max_len, dtype=torch.float32) - (self.max_len - 1)    # -(Lmax-1) .. 0
            self.register_buffer("alibi_keys", slopes[:, None] * key_pos * math.sqrt(self.d_k),
                                 persistent=False)                                             # [H, Lmax]
        if self.kind is AttentionKind.RELATIVE:
            tau0 = torch.tensor([1.0 / m for m in alibi_slopes(H)])        # start as ALiBi-like recency
            self.mix_logit = nn.Parameter(torch.zeros(H))                   # lam = 0.5 at start
            self.tau_raw = nn.Parameter(tau0 + torch.log(-torch.expm1(-tau0)))   # softplus^-1(tau0)
            self.frozen_masks: tuple[MaskKind, ...] = ()                    # set by freeze_biases()

    # -- learner-independent biases --------------------------------------------------------------
    def freeze_biases(self) -> None:
        """Precompute the relative recency tables as constants [H, Lmax, Lmax] (before export). They
        are non-persistent buffers, so they follow the module's device (`.to("cuda")`, `.to("meta")`)
        and stay out of checkpoints."""
        if self.kind is AttentionKind.RELATIVE:
            with torch.no_grad():
                tau = F.softplus(self.tau_raw)
                dist = distance_table(self.max_len).to(tau.device)
                for m in MaskKind:
                    self.register_buffer(_frozen_name(m), recency_weights(dist, tau, m), persistent=False)
                self.frozen_masks = tuple(MaskKind)

    def _recency(self, mask: MaskKind, ctx: SequenceContext) -> Tensor:
        if mask in self.frozen_masks:
            weights = ctx.table(self.get_buffer(_frozen_name(mask)))
        else:
            weights = recency_weights(ctx.distance, F.softplus(self.tau_raw), mask)
        return ctx.restrict(weights)                                          # [H, L, L]

    def _relative_mix(self, content: Tensor, v: Tensor, mask: MaskKind, ctx: SequenceContext) -> Tensor:
        """lam * content + (1 - lam) * recency attention applied to v; content [B, H, L, dk], v [B, H, K, dk]."""
        weights = self._recency(mask, ctx).to(v.dtype)                       # [H, L, K]
        valid = ctx.key_valid()[:, 0].to(v.dtype)                            # [B, K]
        values = v * valid[:, None, :, None]                                 # [B, H, L, dk]
        if torch.onnx.is_in_onnx_export():       # onnxruntime: broadcast MatMul is its fastest form
            recency = (weights @ values) / (weights @ valid[:, None, :, None]).clamp(min=1.0)
        else:                                    # PyTorch: einsum is ~10x faster than a broadcast matmul
            recency = (torch.einsum("hij,bhjd->bhid", weights, values)
                       / torch.einsum("hij,bj->bhi", weights, valid).clamp(min=1.0).unsqueeze(-1))
        lam = torch.sigmoid(self.mix_logit).to(v.dtype)[None, :, None, None]
        return lam * content + (1.0 - lam) * recency

    def _monotonic_probs(self, q: Tensor, k: Tensor, mask: MaskKind, ctx: SequenceContext) -> Tensor:
        scores = ctx.scores(q * (1.0 / math.sqrt(self.d_k)), k)              # [B, H, L, K]
        bias = ctx.additive_mask(mask, scores.dtype)                         # [B, 1, L, K]
        p = torch.softmax(scores.detach() + bias, dim=-1)
        # attention mass beyond key j: p @ U with U[j', j] = [j' > j]. A matmul rather than a cumsum
        # (onnxruntime's CumSum took 37% of this model's time); exactly 0 at the last visible key
        # (only masked zeros beyond it) and >= 0, so the sqrt below never sees rounding noise
        remaining = p @ ctx.later_keys(p.dtype)                              # [B, H, L, K]
        # exp(-theta_h sqrt(remaining |i-j|)) = exp(sqrt(remaining) * rate) with the [H, L, L] rate
        # -theta_h sqrt(|i-j|): one pass over [B, H, L, L] fewer
        rate = -F.softplus(self.gamma.to(scores.dtype)) * ctx.distance.abs().sqrt()     # [H, L, K]
        effect = torch.exp(remaining.sqrt() * rate).clamp(min=1e-5)         # <= 1; remaining detached
        return torch.softmax(scores * effect + bias, dim=-1)

    def _explicit_probs(self, q: Tensor, k: Tensor, mask: MaskKind, ctx: SequenceContext) -> Tensor:
        """[B, H, L, K] attention probabilities over the context's key columns (rows without keys
        zeroed) for the kinds that have one distribution; RELATIVE returns the mixture."""
        has_key = ctx.has_key(mask)
        if self.kind is AttentionKind.MONOTONIC:
            return self._monotonic_probs(q, k, mask, ctx) * has_key
        scores = ctx.scores(q, k) / math.sqrt(self.d_k) + ctx.additive_mask(mask, q.dtype)
        if self.kind is AttentionKind.ALIBI:
            scores = scores + ctx.table(self.alibi).to(q.dtype)
        probs = torch.softmax(scores, dim=-1) * has_key
        if self.kind is AttentionKind.RELATIVE:
            weights = self._recency(mask, ctx)[None] * ctx.key_valid()[:, None].to(q.dtype)   # [B, H, L, K]
            recency = weights / weights.sum(-1, keepdim=True).clamp(min=1.0)
            lam = torch.sigmoid(self.mix_logit).to(q.dtype)[None, :, None, None]
            probs = lam * probs + (1.0 - lam) * recency
        return probs

    def _fused(self, q: Tensor, k: Tensor, v: Tensor, mask: MaskKind, ctx: SequenceContext, drop: float) -> Tensor:
        q, k, v = q.float(), k.float(), v.float()
        B, H, L, dk = q.shape
        bias = ctx.additive_mask(mask, torch.float32)                        # [B, 1, L, L]
        if self.kind is AttentionKind.MONOTONIC:
            if self.recompute and self.training and torch.is_grad_enabled():
                # keep only q and k for backward: ~5 [B, H, L, L] tensors less per layer (a CL4KT
                # step at batch 512 otherwise needs > 13 GB)
                probs = checkpoint(self._monotonic_probs, q, k, mask, ctx, use_reentrant=False)
            else:
                probs = self._monotonic_probs(q, k, mask, ctx)
            return F.dropout(probs, drop, self.training) @ v
        stepped = ctx.rank                   # a step context's appended rows: keys are cached columns, then them
        if self.kind is AttentionKind.ALIBI and stepped:                     # the table as a bias [B, H, L, K]
            bias = bias + ctx.table(self.alibi).to(bias.dtype)[None]
        elif self.kind is AttentionKind.ALIBI:                               # one extra channel
            keys = ctx.key_table(self.alibi_keys)[None, :, :, None].expand(B, H, k.shape[2], 1)
            q = torch.cat([q, torch.ones_like(q[..., :1])], dim=-1)          # [B, H, L, dk+1]
            k = torch.cat([k, keys], dim=-1)
        widen = self.kind is AttentionKind.ALIBI and not stepped and not torch.onnx.is_in_onnx_export()
        if widen:                            # PyTorch's flash kernel needs equal q/k/v widths (2.5x faster)
            v = torch.cat([v, torch.zeros_like(v[..., :1])], dim=-1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=drop, scale=1.0 / math.sqrt(dk))
        if widen:
            out, v = out[..., :dk], v[..., :dk]
        if self.kind is AttentionKind.RELATIVE:
            out = self._relative_mix(out, v, mask, ctx)
        return out

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
        k, v = ctx.extend(self.name, k, v)                                    # a step context's cached keys first
        drop = self.dropout if self.training else 0.0

        with _float32():
            if collect.want_attention or not self.fused or not ctx.plain_keys:
                probs = self._explicit_probs(q.float(), k.float(), mask, ctx)    # [B, H, L, K]
                if collect.want_attention:
                    collect.attention.append(probs.detach())
                    collect.names.append(self.name)
                out = ctx.apply(F.dropout(probs, drop, self.training), v.float())   # [B, H, L, dk]
            else:
                out = self._fused(q, k, v, mask, ctx, drop) * ctx.has_key(mask)   # [B, H, L, dk]

        if self.router is not None:
            routing = self.router(qp, ctx)
            weights = routing.weights.transpose(1, 2).unsqueeze(-1)            # [B, H, L or 1, 1]
            out = out * weights.to(out.dtype)
            collect.balance.append(routing.balance)
            if collect.want_routing:
                collect.routing.append(routing.weights.detach())
                collect.head_routing[self.name] = routing.weights.detach()
        out = out.transpose(1, 2).reshape(B, L, d)                            # [B, L, d]
        return self.out(out.to(qp.dtype))


def _frozen_name(mask: MaskKind) -> str:
    """The buffer holding the frozen recency table of `mask`."""
    return f"frozen_recency_{mask.value}"
