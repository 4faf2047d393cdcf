"""DKT (Piech et al. 2015): an LSTM over past interactions, the classic reference point.

The hidden state at t summarises interactions < t (a learned start vector at the first position) and
a linear layer scores every skill; the logit for position t is the score of skill s_t. Left-padded
inputs are rotated so each learner starts at index 0 (the LSTM never sees padding before the real
interactions), then rotated back: predictions do not depend on the amount of padding.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from training.config import Backbone, ModelConfig
from training.models.base import KTModel, register
from training.models.context import SequenceContext
from training.models.outputs import Collector


@register(Backbone.DKT)
class DKT(KTModel):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.interaction = nn.Embedding(2 * cfg.n_skills, cfg.d_model)      # index 2*s + r
        self.start = nn.Parameter(torch.zeros(cfg.d_model))
        self.lstm = nn.LSTM(cfg.d_model, cfg.lstm_hidden, batch_first=True)
        self.drop = nn.Dropout(cfg.dropout)
        self.out = nn.Linear(cfg.lstm_hidden, cfg.n_skills)
        self.reset_parameters()

    def compute(self, questions: Tensor, skills: Tensor, responses: Tensor, ctx: SequenceContext,
                collect: Collector) -> tuple[Tensor, dict]:
        B, L = skills.shape
        steps = ctx.positions.new_ones(1, L).cumsum(1) - 1                   # [1, L] 0..L-1
        length = steps.new_zeros(1, 1) + L                                   # [1, 1] (a tensor: exports cleanly)
        pad = length - ctx.valid.long().sum(1, keepdim=True)                 # [B, 1]
        to_right = torch.remainder(steps + pad, length)                      # right[j] = left[j + pad]
        s, r = skills.gather(1, to_right), responses.gather(1, to_right)     # [B, L], learner starts at 0
        e = self.interaction(2 * s + r)                                      # [B, L, d]
        inputs = torch.cat([self.start.expand(B, 1, -1), e[:, :-1]], dim=1)  # input j = interaction j-1
        h, _ = self.lstm(inputs)                                             # [B, L, hidden]
        scores = self.out(self.drop(h)).gather(-1, s.unsqueeze(-1)).squeeze(-1)   # [B, L]
        logits = scores.gather(1, torch.remainder(steps - pad, length))     # back to left padding
        return logits, {}
