"""The explain forward: a rank-layout forward that also returns the knowledge retriever's last attention layer."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from training.models.kt_model import KTModel
from training.models.outputs import Collector

RETRIEVER = "retriever."        # name prefix of the knowledge retriever's layers (AKT, SimpleKT)


@dataclass
class Explanation:
    logits: Tensor          # [B, N] as KTModel.rank
    attention: Tensor       # [B, N, heads, H] last retriever layer: candidate j -> history position
    head_weights: Tensor    # [B, N, heads] that layer's weight of each head at the candidate


def explained_layer(names: list[str]) -> int:
    """Index of the knowledge retriever's last layer among the collected attention maps (the last
    retriever.* layer; a model without one, e.g. CL4KT's names: the last attention layer)."""
    retriever = [i for i, name in enumerate(names) if name.startswith(RETRIEVER)]
    return (retriever or list(range(len(names))))[-1]


def explain_rank(model: KTModel, history_questions: Tensor, history_skills: Tensor, history_responses: Tensor,
                 candidate_questions: Tensor, candidate_skills: Tensor) -> Explanation:
    """KTModel.rank's forward (same inputs, same logits) collecting attention and routing; for
    models with attention layers only (ValueError otherwise: DKT)."""
    H = history_skills.shape[1]
    collect = Collector(want_attention=True, want_routing=True)
    logits, _ = model.compute(*model.rank_layout(history_questions, history_skills, history_responses,
                                                 candidate_questions, candidate_skills), collect, read_from=H)  # [B, N]
    if not collect.attention:
        raise ValueError(f"{type(model).__name__} has no attention layer to explain")
    layer = explained_layer(collect.names)
    probs = collect.attention[layer]                                                      # [B, heads, H+N, H+N]
    attention = probs[:, :, H:, :H].transpose(1, 2)                                       # [B, N, heads, H]
    routing = collect.head_routing.get(collect.names[layer])                              # [B, H+N, heads] or None
    heads = attention.shape[2]
    weights = (routing[:, H:] if routing is not None
               else torch.ones(*attention.shape[:2], heads, dtype=attention.dtype, device=attention.device))
    return Explanation(logits=logits.float(), attention=attention.float(), head_weights=weights.float())
