"""SimpleKT backbone (Liu et al. 2023, pyKT's definition) with any attention kind and dense or routed heads.

x_t = c_{s_t} + mu_{q_t} * d_{s_t} (mu a d-dim difficulty vector), y_t = c_{s_t} + g_{r_t};
fixed sinusoidal positions (counted from the learner's first interaction, so padding-invariant)
are added to both; n_blocks retriever layers (PAST mask, q=k=h, v=y). Prediction MLP(concat[h_t, x_t]).
"""
from __future__ import annotations

from torch import Tensor, nn

from routerkt.contract.signature import PAD_ID
from training.config import Backbone, ModelConfig
from training.models.kt_model import KTModel, masked_mean, register
from training.models.context import MaskKind, SequenceContext
from training.models.layers import PredictionHead, TransformerLayer, sinusoidal
from training.models.outputs import Collector
from training.models.skill_sets import embed_set


@register(Backbone.SIMPLEKT)
class SimpleKT(KTModel):
    zero_init = ("difficulty",)

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        d = cfg.d_model
        self.skill = nn.Embedding(cfg.n_skills, d, padding_idx=PAD_ID)
        self.skill_var = nn.Embedding(cfg.n_skills, d, padding_idx=PAD_ID)
        self.difficulty = nn.Embedding(cfg.n_questions, d)                   # mu_q, vector difficulty
        self.response = nn.Embedding(2, d)
        self.blocks = nn.ModuleList(
            TransformerLayer(cfg, MaskKind.PAST, ffn=True, name=f"retriever.{i}") for i in range(cfg.n_blocks))
        self.head = PredictionHead(cfg)
        self.reset_parameters()

    def compute(self, questions: Tensor, skills: Tensor, responses: Tensor, ctx: SequenceContext,
                collect: Collector, read_from: int = 0) -> tuple[Tensor, dict]:
        c = embed_set(self.skill, skills)                                    # [B, L, d]; skills [B, L, K]
        mu = self.difficulty(questions)                                      # [B, L, d]
        x = c + mu * embed_set(self.skill_var, skills)
        y = c + self.response(responses)
        pe = sinusoidal(ctx.positions, self.config.d_model)                  # [B, L, d]
        h, values = x + pe, y + pe
        for layer in self.blocks:
            h = layer(h, h, values, ctx, collect)
        logits = self.head(h[:, read_from:], x[:, read_from:])               # [B, L - read_from]
        return logits, {"rasch_l2": (self.config.rasch_l2, masked_mean(mu ** 2, ctx.valid))}
