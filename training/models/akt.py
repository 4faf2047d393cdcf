"""AKT backbone (Ghosh et al. 2020) with any attention kind and dense or routed heads.

Embeddings (Rasch): x_t = c_{s_t} + mu_{q_t} d_{s_t};  y_t = c_{s_t} + g_{r_t} + mu_{q_t} (h_{r_t} + d_{s_t}).
Knowledge encoder: n_blocks layers, CURRENT mask, q=k=v=y, with FFN.
Then 2*n_blocks layers alternating: question self-attention (CURRENT, q=k=v=h, no FFN) and the
knowledge retriever (PAST, q=k=h, v=encoded y, with FFN). Prediction: MLP(concat[h_t, x_t]).
In the rank layout the knowledge encoder runs on the history alone (the retriever's PAST mask never
shows a candidate its own encoded y; `SequenceContext.history_only`).
With heads=router and standard attention this is RouterKT's RouterAKT (every layer routed).
`encoder_attention=monotonic` gives the encoders (knowledge and question) AKT's monotonic attention
while the retriever keeps `attention` (FoLiBi: ALiBi in the retriever only).
"""
from __future__ import annotations

from torch import Tensor, nn

from routerkt.contract.signature import PAD_ID
from training.config import Backbone, ModelConfig
from training.models.kt_model import KTModel, masked_mean, register
from training.models.context import MaskKind, SequenceContext
from training.models.layers import PredictionHead, TransformerLayer
from training.models.outputs import Collector
from training.models.skill_sets import embed_set


@register(Backbone.AKT)
class AKT(KTModel):
    zero_init = ("difficulty",)

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        d = cfg.d_model
        self.skill = nn.Embedding(cfg.n_skills, d, padding_idx=PAD_ID)        # c_s
        self.skill_var = nn.Embedding(cfg.n_skills, d, padding_idx=PAD_ID)    # d_s, variation vector
        self.difficulty = nn.Embedding(cfg.n_questions, 1)                   # mu_q, scalar difficulty
        self.response = nn.Embedding(2, d)                                   # g_r
        self.response_var = nn.Embedding(2, d)                               # h_r
        self.knowledge_encoder = nn.ModuleList(
            TransformerLayer(cfg, MaskKind.CURRENT, ffn=True, name=f"knowledge_encoder.{i}", kind=cfg.encoder_kind)
            for i in range(cfg.n_blocks))
        self.question_encoder = nn.ModuleList(
            TransformerLayer(cfg, MaskKind.CURRENT, ffn=False, name=f"question_encoder.{i}", kind=cfg.encoder_kind)
            for i in range(cfg.n_blocks))
        self.retriever = nn.ModuleList(
            TransformerLayer(cfg, MaskKind.PAST, ffn=True, name=f"retriever.{i}") for i in range(cfg.n_blocks))
        self.head = PredictionHead(cfg)
        self.reset_parameters()

    def _encode_knowledge(self, y: Tensor, ctx: SequenceContext, collect: Collector) -> Tensor:
        for layer in self.knowledge_encoder:
            y = layer(y, y, y, ctx, collect)
        return y                                                             # [B, L, d]

    def compute(self, questions: Tensor, skills: Tensor, responses: Tensor, ctx: SequenceContext,
                collect: Collector, read_from: int = 0) -> tuple[Tensor, dict]:
        mu = self.difficulty(questions)                                      # [B, L, 1]
        c, dvar = embed_set(self.skill, skills), embed_set(self.skill_var, skills)   # [B, L, d]; skills [B, L, K]
        x = c + mu * dvar
        y = c + self.response(responses) + mu * (self.response_var(responses) + dvar)
        y = ctx.history_only(lambda y_, hctx: self._encode_knowledge(y_, hctx, collect), y)   # [B, L, d]
        h = x
        for question_layer, retriever_layer in zip(self.question_encoder, self.retriever):
            h = question_layer(h, h, h, ctx, collect)
            h = retriever_layer(h, h, y, ctx, collect)
        logits = self.head(h[:, read_from:], x[:, read_from:])               # [B, L - read_from]
        return logits, {"rasch_l2": (self.config.rasch_l2, masked_mean(mu.squeeze(-1) ** 2, ctx.valid))}
