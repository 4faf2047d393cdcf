"""DKT (Piech et al. 2015): an LSTM over past interactions, the classic reference point.

The hidden state at t summarises interactions < t (a learned start vector at the first position) and
a linear layer scores every skill; the logit for position t is the mean score of the skills in the
set s_t. Left-padded inputs are rotated so each learner starts at index 0 (the LSTM never sees padding before the real
interactions), then rotated back: predictions do not depend on the amount of padding.
`rank` runs the LSTM over the history once: every candidate's logit is read from the state after
the last history interaction (the state at t never depends on the question at t); its inputs
(`history_inputs`) also start the step path's LSTM state (training/models/step.py).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from training.config import Backbone, ModelConfig
from training.models.kt_model import KTModel, register
from training.models.context import SequenceContext
from training.models.outputs import Collector
from training.models.skill_sets import as_sets, embed_set, gather_positions, present, set_scores


@register(Backbone.DKT)
class DKT(KTModel):
    chunked_band = False          # the LSTM runs a whole history as it is

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.interaction = nn.Embedding(2 * cfg.n_skills, cfg.d_model)      # index 2*s + r
        self.start = nn.Parameter(torch.zeros(cfg.d_model))
        self.lstm = nn.LSTM(cfg.d_model, cfg.lstm_hidden, batch_first=True)
        self.drop = nn.Dropout(cfg.dropout)
        self.out = nn.Linear(cfg.lstm_hidden, cfg.n_skills)
        self.reset_parameters()

    def compute(self, questions: Tensor, skills: Tensor, responses: Tensor, ctx: SequenceContext,
                collect: Collector, read_from: int = 0) -> tuple[Tensor, dict]:
        B = skills.shape[0]
        steps, length, pad = _rotation(ctx.valid)
        to_right = torch.remainder(steps + pad, length)                      # right[j] = left[j + pad]
        s, r = gather_positions(skills, to_right), responses.gather(1, to_right)   # [B, L, K], [B, L]
        e = embed_set(self.interaction, s, 2 * s + r.unsqueeze(-1))          # [B, L, d]
        inputs = torch.cat([self.start.expand(B, 1, -1), e[:, :-1]], dim=1)  # input j = interaction j-1
        h, _ = self.lstm(inputs)                                             # [B, L, hidden]
        scores = set_scores(self.out(self.drop(h)), s)                       # [B, L]: mean over each set
        logits = scores.gather(1, torch.remainder(steps - pad, length))     # back to left padding
        return logits[:, read_from:], {}

    def rank(self, history_questions: Tensor, history_skills: Tensor, history_responses: Tensor,
             candidate_questions: Tensor, candidate_skills: Tensor) -> Tensor:
        candidate_skills = as_sets(candidate_skills)
        inputs, seen = self.history_inputs(history_skills, history_responses)   # [B, H+1, d], [B, 1]
        h, _ = self.lstm(inputs)                                             # [B, H+1, hidden]
        seen = seen.unsqueeze(-1).expand(-1, 1, h.shape[-1])                 # [B, 1, hidden]: index n
        state = h.gather(1, seen)                                            # after start + n interactions
        scores = self.out(self.drop(state))                                  # [B, 1, n_skills]
        n = candidate_skills.shape[1]
        return set_scores(scores.expand(-1, n, -1), candidate_skills).float()   # [B, N]

    def history_inputs(self, history_skills: Tensor, history_responses: Tensor) -> tuple[Tensor, Tensor]:
        """The LSTM inputs [B, H+1, d] of a left-padded history [B, H] (skills [B, H] or [B, H, K]):
        the start vector, then the learner's n interactions, padding after them; and n [B, 1], the
        index of the state after the last one."""
        history_skills = as_sets(history_skills)
        B = history_skills.shape[0]
        valid = present(history_skills)                                      # [B, H]
        steps, length, pad = _rotation(valid)
        to_right = torch.remainder(steps + pad, length)
        s = gather_positions(history_skills, to_right)                       # [B, H, K], learner starts at 0
        r = history_responses.clamp(0, 1).gather(1, to_right)
        e = embed_set(self.interaction, s, 2 * s + r.unsqueeze(-1))          # [B, H, d]
        inputs = torch.cat([self.start.expand(B, 1, -1), e], dim=1)          # [B, H+1, d]
        return inputs, length - pad


def _rotation(valid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """steps [1, L] 0..L-1, length [1, 1] = L and pad [B, 1] = #padding positions, as tensors
    (they export cleanly with a dynamic L)."""
    L = valid.shape[1]
    steps = valid.new_ones(1, L, dtype=torch.long).cumsum(1) - 1
    length = steps.new_zeros(1, 1) + L
    return steps, length, length - valid.long().sum(1, keepdim=True)
