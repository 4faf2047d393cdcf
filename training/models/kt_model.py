"""The one model interface (`KTModel`) and the backbone registry decorator.

Every model takes re-indexed, left-padded `questions`, `responses` [B, L] and skill sets `skills`
[B, L, K] (PAD_ID in unused slots; training/models/skill_sets.py; [B, L] is read as one skill each)
and returns a `ModelOutput` with logits [B, L] for P(correct at t | questions <= t, responses < t), an
explicit weighted auxiliary loss, and on request attention maps and routing weights. Subclasses implement
`compute`; the trainer, exporter and evaluator only ever call `forward` (never branch on a name).

`rank` scores N candidate questions after one shared history in one forward: the candidates are N
extra positions that each see the history and themselves (SequenceContext.build_rank), so
rank(...)[:, j] equals forward([history, candidate_j]).logits[:, -1]. Backbones whose layers read
positions only through the context get it for free; others (DKT) override `rank`. The prediction
MLP runs on the candidate positions only (`compute(read_from=H)`): served graphs compute only what
is read, while `forward` (training, the score graph) keeps every position.

Band models (ModelConfig.context=band): `forward` over more than W positions and `rank` after a history
of W or more run in chunks against a rolling buffer (training/models/band.py), the function the server's
step path computes; up to W positions a band mask changes nothing, so the plain layouts serve.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from routerkt.contract.signature import CANDIDATE_RESPONSE
from training.config import Backbone, ModelConfig
from training.models.attention import MultiHeadAttention
from training.models.band import band_compute, band_state, cached_logits
from training.models.context import SequenceContext
from training.models.outputs import Collector, ModelOutput
from training.models.skill_sets import as_sets

MODELS: dict[Backbone, type["KTModel"]] = {}


def register(backbone: Backbone) -> Callable[[type["KTModel"]], type["KTModel"]]:
    def wrap(cls: type[KTModel]) -> type[KTModel]:
        MODELS[backbone] = cls
        return cls
    return wrap


def masked_mean(values: Tensor, valid: Tensor) -> Tensor:
    """Mean of `values` [B, L, ...] over valid positions [B, L] (and any trailing dims)."""
    mask = valid.to(values.dtype).view(*valid.shape, *([1] * (values.dim() - 2)))
    denom = mask.sum() * (values[0, 0].numel() if values.dim() > 2 else 1)
    return (values * mask).sum() / denom.clamp(min=1.0)


class KTModel(nn.Module):
    # Parameter tables holding per-question difficulty; initialised to 0 (Rasch: start from the skill)
    zero_init: tuple[str, ...] = ()
    # Attention backbones run a band model's long sequences in chunks (band.py); a recurrent one runs any length
    chunked_band: bool = True

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.n_questions < 2 or cfg.n_skills < 2:
            raise ValueError("model config needs n_questions and n_skills from the vocabulary")
        self.config = cfg

    def reset_parameters(self) -> None:
        """Xavier-uniform for every matrix (embeddings included), zero biases, zero difficulty tables.
        Padding rows of embeddings are zeroed again afterwards."""
        for name, p in self.named_parameters():
            if any(name.startswith(z) for z in self.zero_init):
                nn.init.zeros_(p)
            elif p.dim() > 1 and "lstm" not in name:
                nn.init.xavier_uniform_(p)
            elif name.endswith(".bias") and "lstm" not in name:
                nn.init.zeros_(p)
        for m in self.modules():
            if isinstance(m, nn.Embedding) and m.padding_idx is not None:
                with torch.no_grad():
                    m.weight[m.padding_idx].zero_()

    def compute(self, questions: Tensor, skills: Tensor, responses: Tensor, ctx: SequenceContext,
                collect: Collector, read_from: int = 0) -> tuple[Tensor, dict[str, tuple[float, Tensor]]]:
        """Return logits [B, L - read_from] of positions read_from.. and auxiliary terms {name:
        (weight, unweighted scalar)}. Positions before `read_from` still feed the attention; only
        their prediction MLP is skipped (serving reads the candidates alone)."""
        raise NotImplementedError

    def forward(self, questions: Tensor, skills: Tensor, responses: Tensor, *,
                return_attention: bool = False, return_routing: bool = False) -> ModelOutput:
        skills = as_sets(skills)                                     # [B, L] callers: one skill each
        collect = Collector(want_attention=return_attention, want_routing=return_routing)
        if self._chunked(questions.shape[1]):
            logits, terms, _ = band_compute(self, questions, skills, responses.clamp(0, 1), collect)
        else:
            ctx = SequenceContext.build(skills, self.config.band)
            logits, terms = self.compute(questions, skills, responses.clamp(0, 1), ctx, collect)
        if collect.balance:
            terms["balance"] = (self.config.balance_beta, collect.balance_loss(logits.device))
        aux_loss = torch.zeros((), device=logits.device)
        for weight, value in terms.values():
            if weight:
                aux_loss = aux_loss + weight * value.float()
        return ModelOutput(
            logits=logits.float(), aux_loss=aux_loss,
            aux={name: value.detach() for name, (_, value) in terms.items()},
            attention=collect.attention if return_attention else None,
            attention_names=collect.names if return_attention else None,
            routing=collect.routing if return_routing else None)

    def rank(self, history_questions: Tensor, history_skills: Tensor, history_responses: Tensor,
             candidate_questions: Tensor, candidate_skills: Tensor) -> Tensor:
        """Logits [B, N] of each candidate after its learner's history, for inference (eval mode).

        history_*: [B, H] left-padded like a window without its last slot (skills [B, H, K]);
        candidate_*: [B, N] (skills [B, N, K], the same K; padding candidates, every skill slot
        PAD_ID, get a meaningless logit). Entry j equals the last logit
        of the window [history, candidate_j] with response CANDIDATE_RESPONSE at the candidate."""
        H = history_skills.shape[1]
        if self._chunked(H + 1):                    # a band model after W or more: the rolling buffer
            state = band_state(self, history_questions, as_sets(history_skills), history_responses)
            return cached_logits(self, state, candidate_questions, as_sets(candidate_skills)).float()
        logits, _ = self.compute(*self.rank_layout(history_questions, history_skills, history_responses,
                                                   candidate_questions, candidate_skills), Collector(), read_from=H)
        return logits.float()                                                                # [B, N]

    def rank_layout(self, history_questions: Tensor, history_skills: Tensor, history_responses: Tensor,
                    candidate_questions: Tensor, candidate_skills: Tensor
                    ) -> tuple[Tensor, Tensor, Tensor, SequenceContext]:
        """`compute`'s (questions [B, H+N], skills [B, H+N, K], responses [B, H+N], context) of the
        rank layout: the history, then the candidates with response CANDIDATE_RESPONSE."""
        if self.config.leaks_future:
            raise ValueError("the whole-window 'sequence' routing scope has no history-once ranking")
        history_skills, candidate_skills = as_sets(history_skills), as_sets(candidate_skills)
        ctx = SequenceContext.build_rank(history_skills, candidate_skills, self.config.band)
        questions = torch.cat([history_questions, candidate_questions], dim=1)               # [B, H+N]
        skills = torch.cat([history_skills, candidate_skills], dim=1)                        # [B, H+N, K]
        responses = torch.cat([history_responses.clamp(0, 1),
                               torch.full_like(candidate_questions, CANDIDATE_RESPONSE)], dim=1)
        return questions, skills, responses, ctx

    def _chunked(self, length: int) -> bool:
        """Whether `length` positions run in chunks: a band model's attention beyond its band."""
        return bool(self.config.band) and self.chunked_band and length > self.config.max_len

    def freeze_biases(self) -> None:
        """Precompute learner-independent attention biases as constants (before export)."""
        for m in self.modules():
            if isinstance(m, MultiHeadAttention):
                m.freeze_biases()
