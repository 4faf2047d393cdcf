"""CL4KT's contrastive objective (training only): two augmented views of each learner's sequence are
encoded by the question and interaction encoders, mean-pooled over valid positions, and matched
with in-batch InfoNCE (temperature tau); the interaction loss also gets a hard negative, the same
sequence with every response flipped. Augmentations, on left-padded [B, L] tensors:
crop (keep a random span of (1 - crop) of the history), permute (shuffle a random span of
`permute` of it), mask (a skill becomes [MASK] with probability `mask`) and replace (a skill
becomes a random skill with probability `replace`).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from routerkt.contract.signature import FIRST_ID, PAD_ID
from training.config import ModelConfig
from training.models.skill_sets import gather_positions, present


def augment(skills: Tensor, responses: Tensor, cfg: ModelConfig, mask_id: int) -> tuple[Tensor, Tensor]:
    """One random view. skills [B, L, K], responses [B, L] (0/1); returns the same shapes. Mask and
    replace act on each skill of a set."""
    B, L, K = skills.shape
    dev = skills.device
    valid = present(skills)
    n = valid.sum(1)                                                          # [B]
    steps = torch.arange(L, device=dev)[None]                                 # [1, L]
    # crop: keep m of the n interactions, starting at a random offset, re-padded on the left
    m = (n - torch.floor(cfg.cl_crop_prob * n.float()).long()).clamp(min=1)
    start = torch.floor(torch.rand(B, device=dev) * (n - m + 1).float()).long()
    source = (L - n + start)[:, None] + steps - (L - m)[:, None]              # [B, L]
    keep = steps >= (L - m)[:, None]
    source = source.clamp(0, L - 1)
    # permute: shuffle a span of p positions inside the kept part
    p = torch.floor(cfg.cl_permute_prob * m.float()).long()
    a = (L - m) + torch.floor(torch.rand(B, device=dev) * (m - p + 1).float()).long()
    inside = (steps >= a[:, None]) & (steps < (a + p)[:, None])
    keys = torch.where(inside, a[:, None] + torch.rand(B, L, device=dev) * (p - 1).clamp(min=0)[:, None],
                       steps.float().expand(B, L))
    source = source.gather(1, keys.argsort(dim=1, stable=True))
    s = torch.where(keep.unsqueeze(-1), gather_positions(skills, source), PAD_ID)   # [B, L, K]
    r = torch.where(keep, responses.gather(1, source), 0)
    # mask / replace skills
    real = s != PAD_ID
    masked = real & (torch.rand(B, L, K, device=dev) < cfg.cl_mask_prob)
    replaced = real & ~masked & (torch.rand(B, L, K, device=dev) < cfg.cl_replace_prob)
    random_skill = torch.randint(FIRST_ID, max(cfg.n_skills, FIRST_ID + 1), (B, L, K), device=dev)
    s = torch.where(masked, torch.full_like(s, mask_id), torch.where(replaced, random_skill, s))
    return s, r


def _pool(h: Tensor, skills: Tensor) -> Tensor:
    valid = present(skills).to(h.dtype).unsqueeze(-1)                         # [B, L, 1]
    return (h * valid).sum(1) / valid.sum(1).clamp(min=1.0)                   # [B, d]


def _info_nce(anchor: Tensor, positive: Tensor, temperature: float, negative: Tensor | None = None) -> Tensor:
    a, p = F.normalize(anchor.float(), dim=-1), F.normalize(positive.float(), dim=-1)
    logits = a @ p.T / temperature                                            # [B, B]
    if negative is not None:
        logits = torch.cat([logits, a @ F.normalize(negative.float(), dim=-1).T / temperature], dim=1)  # [B, 2B]
    return F.cross_entropy(logits, torch.arange(a.shape[0], device=a.device))


def contrastive_loss(encode_questions: Callable[[Tensor], Tensor],
                     encode_interactions: Callable[[Tensor, Tensor], Tensor],
                     skills: Tensor, responses: Tensor, cfg: ModelConfig, mask_id: int) -> Tensor:
    """L_q + L_i. encode_*: skill sets [B, L, K] (and responses [B, L]) -> [B, L, d] encoder outputs."""
    s1, r1 = augment(skills, responses, cfg, mask_id)
    s2, r2 = augment(skills, responses, cfg, mask_id)
    loss_q = _info_nce(_pool(encode_questions(s1), s1), _pool(encode_questions(s2), s2), cfg.cl_temperature)
    negative = _pool(encode_interactions(skills, 1 - responses), skills)
    loss_i = _info_nce(_pool(encode_interactions(s1, r1), s1), _pool(encode_interactions(s2, r2), s2),
                       cfg.cl_temperature, negative)
    return loss_q + loss_i
