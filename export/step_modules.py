"""The step graphs as torch modules over flat state tensors (routerkt/contract/step_signature.py), wrapping
training/models/step.py: the state is a LayerCache (attention) or the LSTM's (h, c) (DKT), packed into
fixed right-aligned buffers of `history` columns.

Attention: step_start runs the step path's append on an empty cache with every history column (padding
columns included: their keys are never visible), so the cache keeps the history's width; step_append
appends k rows after the `history` cached columns (window indices `history` ..) and keeps the last
`history` columns, padding while the learner has fewer than `history` kept; the state's length counts
every interaction (a band model's positions), its columns the last `history` of them.
DKT: step_append and step_next are the step path's; step_start runs the model's LSTM over
[padding..., start, interactions] where an extra input channel, set on padding steps only, closes the
LSTM's input gate (weight -1e4: the gate is 0 in float32), so padding steps keep the zero initial state
and each learner's final (h, c) is its own, whatever its padding.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from training.models.dkt import DKT
from training.models.skill_sets import embed_set, present
from training.models.step import (append_recurrent, append_rows, cached_logits, recurrent_logits,
                                  Stepping, stepping)
from training.models.step_context import LayerCache

CLOSED_GATE = -1e4      # input-gate weight of DKT's padding channel: sigmoid(-1e4 + ...) is 0 in float32


@dataclass(frozen=True)
class StateLayout:
    """Where each attention layer's cache sits in the flat state: layer names in state_keys order, and
    per layer the widths of its prefix sums in call order (their concatenation is state_sums)."""

    layers: tuple[str, ...]
    sums: tuple[tuple[str, tuple[int, ...]], ...]

    @classmethod
    def of(cls, model) -> "StateLayout":
        """The layout read from the model's own step on one interaction."""
        one = torch.full((1, 1), 2, dtype=torch.long)
        with torch.no_grad():
            cache = append_rows(model, LayerCache(valid=torch.ones(1, 0, dtype=torch.bool)), one,
                                one.unsqueeze(-1), one - 1)
        return cls(tuple(cache.keys), tuple((name, tuple(s.shape[-1] for s in sums))
                                            for name, sums in cache.sums.items()))

    @property
    def width(self) -> int:
        return sum(sum(widths) for _, widths in self.sums)

    def pack(self, cache: LayerCache) -> tuple[Tensor, Tensor, Tensor]:
        """-> state_keys, state_values [B, layers, heads, P, head_dim], state_sums [B, sums]."""
        keys = torch.stack([cache.keys[name][0] for name in self.layers], dim=1)
        values = torch.stack([cache.keys[name][1] for name in self.layers], dim=1)
        parts = [s[:, 0] for name, _ in self.sums for s in cache.sums[name]]                # [B, E] each
        sums = torch.cat(parts, dim=-1) if parts else keys.new_zeros(keys.shape[0], 0)
        return keys, values, sums

    def unpack(self, length: Tensor, keys: Tensor, values: Tensor, sums: Tensor) -> LayerCache:
        """The LayerCache of a flat state: column j of P is valid where j >= P - length."""
        P = keys.shape[3]
        columns = torch.arange(P, device=keys.device)
        cache = LayerCache(valid=columns[None, :] >= P - length[:, None], count=length[:, None])   # [B, P]
        cache.keys = {name: (keys[:, i], values[:, i]) for i, name in enumerate(self.layers)}
        start = 0
        for name, widths in self.sums:
            cache.sums[name] = []
            for width in widths:
                cache.sums[name].append(sums[:, None, start:start + width])                # [B, 1, E]
                start += width
        return cache


class _OverModel(nn.Module):
    """A graph's module: the model (and the attention state's layout) it runs."""

    def __init__(self, model, layout: StateLayout | None = None):
        super().__init__()
        self.model, self.layout = model, layout


class AttentionStart(_OverModel):
    """history [B, P] (skills [.., K]) -> state_length [B], state_keys, state_values, state_sums."""

    def forward(self, history_questions: Tensor, history_skills: Tensor, history_responses: Tensor):
        valid = present(history_skills)                                                    # [B, P]
        cache = append_rows(self.model, LayerCache(valid=valid[:, :0]), history_questions, history_skills,
                            history_responses)
        return (valid.long().sum(1), *self.layout.pack(cache))


class AttentionAppend(_OverModel):
    """state + k interactions per learner (question, response [B, k], skills [B, k, K]) -> the updated state."""

    def forward(self, state_length: Tensor, state_keys: Tensor, state_values: Tensor, state_sums: Tensor,
                append_question: Tensor, append_skills: Tensor, append_response: Tensor):
        P = state_keys.shape[3]
        cache = self.layout.unpack(state_length, state_keys, state_values, state_sums)
        grown = append_rows(self.model, cache, append_question, append_skills, append_response)   # >= P columns
        keys, values, sums = self.layout.pack(grown)
        k = append_question.shape[1]
        return state_length + k, keys[:, :, :, -P:], values[:, :, :, -P:], sums           # the oldest dropped


class AttentionNext(_OverModel):
    """state + candidates [B, C] (skills [B, C, K]) -> candidate_probs [B, C]."""

    def forward(self, state_length: Tensor, state_keys: Tensor, state_values: Tensor, state_sums: Tensor,
                candidate_questions: Tensor, candidate_skills: Tensor) -> Tensor:
        cache = self.layout.unpack(state_length, state_keys, state_values, state_sums)
        return torch.sigmoid(cached_logits(self.model, cache, candidate_questions, candidate_skills).float())


class RecurrentStart(_OverModel):
    """history [B, P] (skills [.., K]) -> state_length [B], state_hidden, state_cell [B, hidden]."""

    def __init__(self, model: DKT):
        super().__init__(model)
        lstm = model.lstm
        self.lstm = nn.LSTM(lstm.input_size + 1, lstm.hidden_size, batch_first=True)     # + the padding channel
        with torch.no_grad():
            hidden = lstm.hidden_size
            gate = torch.zeros(4 * hidden, 1)
            gate[:hidden] = CLOSED_GATE                                                      # rows i, f, g, o: i
            self.lstm.weight_ih_l0.copy_(torch.cat([lstm.weight_ih_l0, gate], dim=1))
            for name in ("weight_hh_l0", "bias_ih_l0", "bias_hh_l0"):
                getattr(self.lstm, name).copy_(getattr(lstm, name))

    def forward(self, history_questions: Tensor, history_skills: Tensor, history_responses: Tensor):
        model, B = self.model, history_skills.shape[0]
        valid = present(history_skills)                                                    # [B, P]
        e = embed_set(model.interaction, history_skills,
                      2 * history_skills + history_responses.clamp(0, 1).unsqueeze(-1))    # [B, P, d]
        before = torch.zeros_like(valid[:, :1])
        real = torch.cat([before, valid], dim=1)                                           # [B, P+1]: e_(j-1) real
        first = ~real & torch.cat([valid, ~before], dim=1)                                 # the start vector's step
        steps = torch.cat([torch.zeros_like(e[:, :1]), e], dim=1) * real.unsqueeze(-1).to(e.dtype)
        steps = steps + first.unsqueeze(-1).to(e.dtype) * model.start                      # [B, P+1, d]
        padding = (~real & ~first).unsqueeze(-1).to(e.dtype)                              # [B, P+1, 1]
        _, (h, c) = self.lstm(torch.cat([steps, padding], dim=-1))                          # [1, B, hidden] each
        return valid.long().sum(1), h[0], c[0]


class RecurrentAppend(_OverModel):
    """state + k interactions per learner -> the updated state (k LSTM steps)."""

    def forward(self, state_length: Tensor, state_hidden: Tensor, state_cell: Tensor,
                append_question: Tensor, append_skills: Tensor, append_response: Tensor):
        h, c = append_recurrent(self.model, (state_hidden[None], state_cell[None]), append_skills, append_response)
        return state_length + append_question.shape[1], h[0], c[0]


class RecurrentNext(_OverModel):
    """state + candidates [B, C] (skills [B, C, K]) -> candidate_probs [B, C]."""

    def forward(self, state_length: Tensor, state_hidden: Tensor, state_cell: Tensor,
                candidate_questions: Tensor, candidate_skills: Tensor) -> Tensor:
        return torch.sigmoid(recurrent_logits(self.model, state_hidden, candidate_skills).float())


def step_modules(model) -> tuple[nn.Module, nn.Module, nn.Module] | None:
    """The (start, append, next) modules of `model`, or None where the step path cannot step it."""
    kind = stepping(model)
    if kind is Stepping.RECURRENT:
        return RecurrentStart(model), RecurrentAppend(model), RecurrentNext(model)
    if kind is Stepping.ATTENTION:
        layout = StateLayout.of(model)
        return AttentionStart(model, layout), AttentionAppend(model, layout), AttentionNext(model, layout)
    return None
