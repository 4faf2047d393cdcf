"""What a model's forward returns (`ModelOutput`) and the per-forward `Collector` that layers append
their auxiliary results to (balance losses, attention maps, routing weights). The collector is
created by each forward call, so no module keeps state between calls."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class Collector:
    want_attention: bool = False
    want_routing: bool = False
    balance: list[Tensor] = field(default_factory=list)     # one scalar per routed layer
    attention: list[Tensor] = field(default_factory=list)   # [B, H, L, L] per attention layer, in call order
    routing: list[Tensor] = field(default_factory=list)     # [B, L, E] aggregated weights per routed layer
    names: list[str] = field(default_factory=list)          # layer name of each attention map
    head_routing: dict[str, Tensor] = field(default_factory=dict)  # routed layer name -> [B, L, E] head weights

    def balance_loss(self, device: torch.device) -> Tensor:
        return torch.stack(self.balance).sum() if self.balance else torch.zeros((), device=device)


@dataclass
class ModelOutput:
    logits: Tensor                                  # [B, L] logit of P(correct at t | questions <= t, responses < t)
    aux_loss: Tensor                                # scalar, already weighted: add it to the BCE
    aux: dict[str, float] = field(default_factory=dict)   # unweighted components, for logging
    attention: list[Tensor] | None = None          # per attention layer [B, H, L, L]
    attention_names: list[str] | None = None
    routing: list[Tensor] | None = None            # per routed layer [B, L, E]
