"""Band models over histories longer than the band: the whole history in chunks against a rolling buffer.

A band model (ModelConfig.context=band, band W = max_len) lets every attention query see at most the
W - 1 positions before it, at every layer. So the keys and values a layer computes for a position are
final once that position is computed, and the last W - 1 columns of each layer (plus the routers'
running prefix sums and the interaction count) are all any later position reads. `band_compute` runs a
left-padded batch of whole histories [B, L] chunk by chunk (C = W rows at a time, oldest first): each
chunk is the step layout's append (training/models/step_context.py) against the previous chunks'
rolling buffer, so training, the served-protocol evaluation and the server's step path compute one
function, exactly. Gradients flow through the buffer (the whole history is one graph).

Cost per layer: L x (W - 1 + C) scores instead of L x L. Rows are sorted by history length and a chunk
runs only the learners that have begun by its end (left padding: a learner is active from its first
interaction's chunk on), so a batch of mostly short learners with one long one pays for its tokens,
not for B x L.

Auxiliary terms (Rasch regulariser, CL4KT's contrastive loss, routers' balance losses) are computed per
chunk and averaged, weighted by each chunk's interactions. Attention maps and routing weights cover at
most W positions (ValueError beyond).
"""
from __future__ import annotations

import torch
from torch import Tensor

from routerkt.contract.signature import CANDIDATE_RESPONSE
from training.models.outputs import Collector
from training.models.skill_sets import present
from training.models.step_context import LayerCache, StepContext


def empty_cache(rows: int, device: torch.device) -> LayerCache:
    """The state before any interaction: no column, count 0."""
    return LayerCache(valid=torch.zeros(rows, 0, dtype=torch.bool, device=device),
                      count=torch.zeros(rows, 1, dtype=torch.long, device=device))


def _grow(cache: LayerCache, rows: int) -> LayerCache:
    """The cache with `rows` - B learners added at the end (nothing seen yet: invalid zero columns)."""
    extra = rows - cache.valid.shape[0]
    if extra <= 0:
        return cache

    def pad(t: Tensor) -> Tensor:
        return torch.cat([t, t.new_zeros(extra, *t.shape[1:])], dim=0)
    return LayerCache(valid=pad(cache.valid), keys={n: (pad(k), pad(v)) for n, (k, v) in cache.keys.items()},
                      sums={n: [pad(s) for s in sums] for n, sums in cache.sums.items()}, count=pad(cache.seen()))


def _chunks(length: int, size: int) -> list[tuple[int, int]]:
    """[start, end) column ranges of `size`, the last ending at `length` (the first may be shorter)."""
    ends = list(range(length, 0, -size))[::-1]
    return [(max(end - size, 0), end) for end in ends]


def band_compute(model, questions: Tensor, skills: Tensor, responses: Tensor, collect: Collector,
                 cache: LayerCache | None = None, chunk: int = 0,
                 logits: bool = True) -> tuple[Tensor, dict, LayerCache]:
    """The model's `compute` over a left-padded batch questions, responses [B, L] (0/1), skills [B, L, K] in
    chunks of `chunk` rows (default W) after `cache` (default: nothing seen). Returns the logits [B, L]
    (zeros at padding; none computed with logits=False: [B, 0]), the auxiliary terms, and the rolling buffer
    (last W - 1 columns) after the batch."""
    cfg = model.config
    if collect.want_attention or collect.want_routing:
        raise ValueError(f"attention maps and routing weights of a band model cover at most {cfg.max_len} positions")
    B, L = questions.shape
    size, keep = chunk or cfg.max_len, cfg.max_len - 1
    valid = present(skills)                                                   # [B, L]
    if cache is None:            # a learner runs from the chunk of its first interaction on
        begun = valid.long().cumsum(1) > 0                                    # [B, L]
        first = (~begun).long().sum(1)                                        # L when it never begins
        order = torch.argsort(first, stable=True)                             # earliest starters first
        state = empty_cache(0, questions.device)
    else:                        # after a given state every learner runs every chunk
        first = torch.zeros(B, dtype=torch.long, device=questions.device)
        order = torch.arange(B, device=questions.device)
        state = cache
    q, s, r, v, first = questions[order], skills[order], responses[order], valid[order], first[order]
    out = torch.zeros(B, L if logits else 0, device=questions.device)
    parts, shares, balance = [], [], []
    total = valid.sum().clamp(min=1).to(torch.float32)
    for start, end in _chunks(L, size):
        rows = int((first < end).sum())
        if rows == 0:
            continue
        state = _grow(state, rows)
        ctx = StepContext.append(state, v[:rows, start:end], band=cfg.band)
        piece = Collector()
        chunk_logits, terms = model.compute(q[:rows, start:end], s[:rows, start:end], r[:rows, start:end], ctx,
                                            piece, read_from=0 if logits else end - start)
        if logits:                                                            # [rows, end - start]
            where = (torch.arange(rows, device=out.device)[:, None], torch.arange(start, end, device=out.device)[None])
            out = out.index_put(where, chunk_logits.float())
        share = ctx.valid.sum().to(torch.float32) / total
        parts.append(terms)
        shares.append(share)
        balance.append([b * share for b in piece.balance])
        state = ctx.stored.last(keep)
    inverse = torch.argsort(order)
    collect.balance.extend(torch.stack(layer).sum() for layer in zip(*balance))
    return out[inverse], _weighted_terms(parts, shares), _select(_grow(state, B), inverse)


def _select(cache: LayerCache, index: Tensor) -> LayerCache:
    """The cache of the learners `index` (a permutation of its rows)."""
    return LayerCache(valid=cache.valid[index], keys={n: (k[index], v[index]) for n, (k, v) in cache.keys.items()},
                      sums={n: [s[index] for s in sums] for n, sums in cache.sums.items()}, count=cache.seen()[index])


def _weighted_terms(parts: list[dict], weights: list[Tensor]) -> dict:
    """{name: (weight, sum over chunks of share x value)} of the chunks' auxiliary terms."""
    out: dict = {}
    for terms, share in zip(parts, weights):
        for name, (weight, value) in terms.items():
            previous = out[name][1] if name in out else 0.0
            out[name] = (weight, previous + share * value)
    return out


def band_state(model, questions: Tensor, skills: Tensor, responses: Tensor,
               cache: LayerCache | None = None) -> LayerCache:
    """The rolling buffer after a left-padded history batch (appended to `cache`), no logits computed."""
    return band_compute(model, questions, skills, responses.clamp(0, 1), Collector(), cache=cache, logits=False)[2]


def cached_logits(model, layers: LayerCache, candidate_questions: Tensor, candidate_skills: Tensor) -> Tensor:
    """Logits [B, C] of candidates (questions [B, C], skill sets [B, C, K]) against a learner's cached layers."""
    ctx = StepContext.candidates(layers, present(candidate_skills), band=model.config.band)
    responses = torch.full_like(candidate_questions, CANDIDATE_RESPONSE)
    return model.compute(candidate_questions, candidate_skills, responses, ctx, Collector())[0]   # [B, C]
