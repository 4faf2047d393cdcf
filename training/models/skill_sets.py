"""Skill sets in the models: an interaction's skills are ids [..., K] (PAD_ID in unused slots, sets
packed from slot 0), embedded as the MEAN of the set's embeddings.

Why the mean: it keeps the scale of a one-skill embedding whatever the set size (a sum would grow
with K and shift every layer's input distribution for multi-skill items), it is order-invariant,
it needs no new parameters, and a set of one skill embeds exactly as that skill did before sets
existed (0 * E[PAD] adds exact zeros, division by 1 is exact), so single-skill data, checkpoints
and exported graphs give the same numbers as before. An all-PAD set (a padding position) embeds as
E[PAD], as a padding skill always did.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from routerkt.contract.signature import PAD_ID


def as_sets(skills: Tensor) -> Tensor:
    """Skills [B, L] (one per interaction, as before sets existed) -> [B, L, 1]; sets [B, L, K] unchanged."""
    return skills.unsqueeze(-1) if skills.dim() == 2 else skills


def present(skills: Tensor) -> Tensor:
    """skills [B, L, K] -> [B, L] bool: the position holds an interaction (its set is not empty)."""
    return (skills != PAD_ID).any(dim=-1)


def set_mean(values: Tensor, skills: Tensor) -> Tensor:
    """values [..., K, d] (one per slot), skills [..., K] -> [..., d]: the mean over the set's slots;
    an empty set gives slot 0's value (the PAD entry)."""
    mask = (skills != PAD_ID).unsqueeze(-1).to(values.dtype)                  # [..., K, 1]
    count = mask.sum(dim=-2)                                                  # [..., 1]
    mean = (values * mask).sum(dim=-2) / count.clamp(min=1.0)                 # [..., d]
    return torch.where(count > 0, mean, values[..., 0, :])


def embed_set(table: nn.Embedding, skills: Tensor, ids: Tensor | None = None) -> Tensor:
    """table(ids) averaged over each set: skills [B, L, K] -> [B, L, d]. `ids` (default: skills)
    are the rows to look up when they are derived from the skills (e.g. skill + offset * response);
    the set's slots are always those of `skills`."""
    return set_mean(table(skills if ids is None else ids), skills)


def gather_positions(skills: Tensor, index: Tensor) -> Tensor:
    """skills [B, L, K] reordered along L by index [B, L'] -> [B, L', K]."""
    return skills.gather(1, index.unsqueeze(-1).expand(-1, -1, skills.shape[-1]))


def set_scores(scores: Tensor, skills: Tensor) -> Tensor:
    """Per-skill scores [B, L, n_skills] and sets [B, L, K] -> [B, L]: the mean score of each set."""
    picked = scores.gather(-1, skills)                                        # [B, L, K]
    return set_mean(picked.unsqueeze(-1), skills).squeeze(-1)
