"""CL4KT backbone (Lee et al. 2022) with any attention kind and dense or routed heads.

Skills only (no Rasch difficulty). x_t = c_{s_t}; y_t = e_{(s_t, r_t)}. A question encoder (CURRENT
mask, on x), an interaction encoder (CURRENT mask, on y) and the knowledge retriever (PAST mask,
q=k=h starting from the encoded questions, v=encoded interactions), n_blocks layers each, GELU FFNs.
Prediction: MLP(concat[h_t, x_t]) with GELU. With `contrastive`, the InfoNCE loss of
training/models/contrastive.py is added during training (causal encoders, as RouterCL4KT does).
`encoder_attention=monotonic`: the two encoders use monotonic attention, the retriever `attention`.
"""
from __future__ import annotations

from torch import Tensor, nn

from routerkt.contract.signature import PAD_ID
from training.config import AttentionKind, Backbone, ModelConfig
from training.models.kt_model import KTModel, register
from training.models.context import MaskKind, SequenceContext
from training.models.contrastive import contrastive_loss
from training.models.layers import PredictionHead, TransformerLayer
from training.models.outputs import Collector
from training.models.skill_sets import embed_set


@register(Backbone.CL4KT)
class CL4KT(KTModel):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        d, n = cfg.d_model, cfg.n_skills
        self.mask_id = n                                                     # extra [MASK] skill row
        self.skill = nn.Embedding(n + 1, d, padding_idx=PAD_ID)
        self.interaction = nn.Embedding(2 * (n + 1), d, padding_idx=PAD_ID)  # index s + (n+1) r

        def stack(name: str, mask: MaskKind, kind: AttentionKind) -> nn.ModuleList:
            return nn.ModuleList(TransformerLayer(cfg, mask, ffn=True, activation="gelu", name=f"{name}.{i}", kind=kind)
                                 for i in range(cfg.n_blocks))
        self.question_encoder = stack("question_encoder", MaskKind.CURRENT, cfg.encoder_kind)
        self.interaction_encoder = stack("interaction_encoder", MaskKind.CURRENT, cfg.encoder_kind)
        self.retriever = stack("retriever", MaskKind.PAST, cfg.attention)
        self.head = PredictionHead(cfg, activation="gelu")
        self.reset_parameters()

    def _encode(self, layers: nn.ModuleList, h: Tensor, ctx: SequenceContext, collect: Collector) -> Tensor:
        for layer in layers:
            h = layer(h, h, h, ctx, collect)
        return h                                                             # [B, L, d]

    def encode_questions(self, skills: Tensor, collect: Collector | None = None) -> Tensor:
        ctx = SequenceContext.build(skills)
        return self._encode(self.question_encoder, embed_set(self.skill, skills), ctx, collect or Collector())

    def encode_interactions(self, skills: Tensor, responses: Tensor, collect: Collector | None = None) -> Tensor:
        ctx = SequenceContext.build(skills)
        interactions = self._interactions(skills, responses)
        return self._encode(self.interaction_encoder, interactions, ctx, collect or Collector())

    def _interactions(self, skills: Tensor, responses: Tensor) -> Tensor:
        """skills [B, L, K], responses [B, L] -> [B, L, d]: row s + (n+1) r per skill, averaged."""
        return embed_set(self.interaction, skills, skills + (self.config.n_skills + 1) * responses.unsqueeze(-1))

    def compute(self, questions: Tensor, skills: Tensor, responses: Tensor, ctx: SequenceContext,
                collect: Collector, read_from: int = 0) -> tuple[Tensor, dict]:
        x = embed_set(self.skill, skills)                                    # [B, L, d]; skills [B, L, K]
        y = self._interactions(skills, responses)
        h = self._encode(self.question_encoder, x, ctx, collect)
        values = ctx.history_only(lambda y_, hctx: self._encode(self.interaction_encoder, y_, hctx, collect), y)
        for layer in self.retriever:
            h = layer(h, h, values, ctx, collect)
        logits = self.head(h[:, read_from:], x[:, read_from:])               # [B, L - read_from]
        terms: dict = {}
        if self.training and self.config.contrastive:
            terms["contrastive"] = (self.config.cl_weight, contrastive_loss(
                self.encode_questions, self.encode_interactions, skills, responses, self.config, self.mask_id))
        return logits, terms
