"""Building blocks shared by the attention backbones: the post-LN transformer layer, its feed-forward
block (dense, or a routed mixture of FFN experts for the ablation), the prediction MLP and
sinusoidal positions."""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from training.config import AttentionKind, ExpertKind, HeadMode, ModelConfig, RouterScoring
from training.models.attention import MultiHeadAttention
from training.models.context import MaskKind, SequenceContext
from training.models.outputs import Collector
from training.models.router import Router

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_model, d_ff), ACTIVATIONS[activation](), nn.Dropout(dropout),
                                 nn.Linear(d_ff, d_model))

    def forward(self, x: Tensor, ctx: SequenceContext, collect: Collector) -> Tensor:
        return self.net(x)                                                   # [B, L, d]


class MixtureFeedForward(nn.Module):
    """FFN experts: n_heads experts (the first n_shared always on), weighted by the same router as
    RouterKT's heads. Every expert runs (dense compute); weights select and scale them."""

    def __init__(self, cfg: ModelConfig, activation: str):
        super().__init__()
        self.experts = nn.ModuleList(FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout, activation)
                                     for _ in range(cfg.n_heads))
        if cfg.router_scoring is not RouterScoring.LEARNED:
            raise ValueError(f"router_scoring={cfg.router_scoring.value} scores attention heads by their query; "
                             "FFN experts need router_scoring=learned")
        self.router = Router(cfg.d_model, cfg.n_heads, cfg.n_shared, cfg.n_selected, cfg.routing_scope,
                             person_topk=cfg.person_topk)

    def forward(self, x: Tensor, ctx: SequenceContext, collect: Collector) -> Tensor:
        routing = self.router(x, ctx)
        outs = torch.stack([e(x, ctx, collect) for e in self.experts], dim=-1)   # [B, L, d, E]
        collect.balance.append(routing.balance)
        if collect.want_routing:
            collect.routing.append(routing.weights.detach())
        return (outs * routing.weights.unsqueeze(2).to(outs.dtype)).sum(-1)       # [B, L, d]


class TransformerLayer(nn.Module):
    """x <- LN(query + Drop(MHA(query, key, value))); then, if ffn: x <- LN(x + Drop(FFN(x))).
    `kind`: this layer's attention kind (default cfg.attention; encoders pass cfg.encoder_kind)."""

    def __init__(self, cfg: ModelConfig, mask: MaskKind, ffn: bool, activation: str = "relu", name: str = "",
                 kind: AttentionKind | None = None):
        super().__init__()
        routed = cfg.heads is HeadMode.ROUTER
        self.mask = mask
        self.attn = MultiHeadAttention(cfg, routed=routed and cfg.experts is ExpertKind.HEADS, name=name, kind=kind)
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.drop1 = nn.Dropout(cfg.dropout)
        self.ffn: nn.Module | None = None
        if ffn:
            self.ffn = (MixtureFeedForward(cfg, activation) if routed and cfg.experts is ExpertKind.FFN
                        else FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout, activation))
            self.norm2 = nn.LayerNorm(cfg.d_model)
            self.drop2 = nn.Dropout(cfg.dropout)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, ctx: SequenceContext, collect: Collector) -> Tensor:
        x = self.norm1(query + self.drop1(self.attn(query, key, value, ctx, self.mask, collect)))
        if self.ffn is not None:
            x = self.norm2(x + self.drop2(self.ffn(x, ctx, collect)))
        return x                                                                 # [B, L, d]


class PredictionHead(nn.Module):
    """concat[state_t, question_t] (2d) -> final_fc -> final_fc2 -> 1 logit."""

    def __init__(self, cfg: ModelConfig, activation: str = "relu"):
        super().__init__()
        act = ACTIVATIONS[activation]
        self.net = nn.Sequential(
            nn.Linear(2 * cfg.d_model, cfg.final_fc), act(), nn.Dropout(cfg.dropout),
            nn.Linear(cfg.final_fc, cfg.final_fc2), act(), nn.Dropout(cfg.dropout),
            nn.Linear(cfg.final_fc2, 1))

    def forward(self, state: Tensor, question: Tensor) -> Tensor:
        return self.net(torch.cat([state, question], dim=-1)).squeeze(-1)        # [B, L]


def sinusoidal(positions: Tensor, d_model: int) -> Tensor:
    """positions: [B, L] long -> [B, L, d] fixed sin/cos encoding."""
    half = d_model // 2
    freq = torch.exp(torch.arange(half, device=positions.device, dtype=torch.float32) * (-math.log(10000.0) / half))
    angles = positions.to(torch.float32).unsqueeze(-1) * freq                     # [B, L, half]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)
