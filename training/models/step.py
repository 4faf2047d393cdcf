"""Incremental learner state (issue 50, part): append answers to a cached state, score candidates as the full path.

    state = start_state(model, questions, skills, responses)      # a left-padded history batch
    state = step(model, state, questions, skills, responses)      # k more interactions per learner
    probs = predict_next(model, state, candidate_questions, candidate_skills)   # [B, C]

`probs` equals what the served full path gives after the same history (KTModel.rank on the last
W - 1 interactions, W = cfg.max_len, the exported window; serving/encoder/window.py), within
float32 rounding. Inference only (eval mode, no gradient).

What is cached (`Stepping`), per learner:
- ATTENTION (AKT, SimpleKT, CL4KT, every attention kind, dense or routed heads): per attention layer
  the projected keys and values of the history positions (2 x d_model floats per position and
  layer), kept in the layer's own order; per routed layer with PREFIX scope the running sums the
  router's prefix mean reads (its numerator [E] and count). Nothing else is needed, because each
  layer reads index-dependent facts through its context (training/models/step_context.py runs the
  models' own `compute` on the new rows): STANDARD needs the keys; ALiBi and the relative recency
  kernel are functions of the index distance i - j of the query and each key column (the cached
  columns keep their window order, so distances are those of the window); AKT's MONOTONIC decay of a
  row is computed from that row's scores against all its visible keys and the distances (the
  attention mass beyond each key is a sum over the row), so it needs the cached keys only.
  SimpleKT's sinusoidal positions are counted from the learner's first interaction in the window
  (cumsum of validity), never from the window start, so the served prediction does not depend on the
  amount of left padding; the step path gives a new row position (count so far) and a candidate
  position (count of the history). AKT's knowledge encoder and CL4KT's interaction encoder run on
  appended rows only: no query ever reads a candidate's own value (PAST mask), as in the rank layout.
  The last layer's outputs at history positions are computed and dropped (only candidates are read).
- RECURRENT (DKT): the LSTM state (h, c) after the start vector and the history.
- RECOMPUTE: models that are not causal per position cannot be stepped: RouterKT's SEQUENCE routing
  scope averages the routing weights over the whole window, the candidate included, so every
  position changes with each new interaction (`cfg.leaks_future`; reproduction only, never served).
  For them (and any backbone not listed here) the state keeps the history alone and `predict_next`
  runs the full forward on each window [history, candidate] (exact by construction).
Every state also keeps the history itself ([B, P] ids, P <= W - 1), for the window edge.

The window edge. For a history of n interactions the served prediction reads the last min(n, W - 1)
and the candidate at window index W - 1. While n <= W - 1 every cached state is final (the models are
causal; padding keys are never visible). Once n >= W each new answer drops the oldest one from the
window: every layer's state at every position changes (softmax rows lose a key, SimpleKT's positions
shift, DKT's LSTM starts one interaction later), and no cache of states of another window start can
be reused exactly. Rule: when an append would make any learner's kept history exceed W - 1, the
state is rebuilt from each learner's last W - 1 interactions (one causal forward over them, the
history part of the full path), so a step past the edge costs about one full forward and stays
exact; candidates are then scored against the rebuilt cache. (A cheaper scheme, e.g. recomputing
every W/2 appends from a fresh half window, would serve between W/2 and W - 1 interactions, i.e.
change the served prediction: a product decision, not made here.) A batch rebuilds all its learners
when one of them passes the edge (exact for all).

Band models (ModelConfig.context=band; training/models/band.py) have no window edge: every layer's query
sees at most the W - 1 positions before it, so the last W - 1 columns of each layer (with the routers'
running sums and the interaction count) are all later positions read, and `step` appends past any length
(the oldest column dropped), never rebuilding. `start_state` runs the whole given history through the
band in chunks; DKT with context=band runs its LSTM over the whole history (no cut).

Layout: learners of one batch are left-padded to P = the longest kept history (leading columns that
are padding for every learner are dropped); every learner of a `step` call appends the same k
interactions (no padding rows: a gap would change the index distances).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.utils.rnn import pack_padded_sequence

from routerkt.contract.signature import CANDIDATE_RESPONSE, PAD_ID
from training.models.akt import AKT
from training.models.band import band_state, cached_logits
from training.models.kt_model import KTModel
from training.models.cl4kt import CL4KT
from training.models.dkt import DKT
from training.models.outputs import Collector
from training.models.simplekt import SimpleKT
from training.models.skill_sets import as_sets, embed_set, present, set_scores
from training.models.step_context import LayerCache, StepContext


class Stepping(enum.Enum):
    ATTENTION = "attention"      # per-layer keys/values (+ router prefix sums)
    RECURRENT = "recurrent"      # the LSTM state
    RECOMPUTE = "recompute"      # the history only; each prediction is a full forward


def stepping(model: KTModel) -> Stepping:
    if model.config.leaks_future:
        return Stepping.RECOMPUTE
    if isinstance(model, DKT):
        return Stepping.RECURRENT
    if isinstance(model, (AKT, SimpleKT, CL4KT)):
        return Stepping.ATTENTION
    return Stepping.RECOMPUTE


@dataclass
class StepState:
    questions: Tensor                  # [B, P] kept history (each learner's last <= W - 1), left-padded
                                       # (band models: the last W - 1 kept for reference; the state covers all)
    skills: Tensor                     # [B, P, K] skill sets, PAD_ID in unused slots and at padding
    responses: Tensor                  # [B, P] 0/1 (padding: anything)
    window: int                        # W: a served window holds W - 1 interactions and the candidate
    layers: LayerCache | None = None   # ATTENTION: per-layer keys/values and prefix sums of the P columns
    recurrent: tuple[Tensor, Tensor] | None = None   # RECURRENT: LSTM (h, c), each [1, B, hidden]
    rebuilt: bool = True               # the caches were (re)computed from the whole kept history

    def nbytes(self) -> dict[str, int]:
        """Bytes held: `cache` (layer caches or LSTM state) and `history` (the kept ids)."""
        cache = self.layers.nbytes() if self.layers is not None else 0
        if self.recurrent is not None:
            cache += sum(t.numel() * t.element_size() for t in self.recurrent)
        history = sum(t.numel() * t.element_size() for t in (self.questions, self.skills, self.responses))
        return {"cache": cache, "history": history}


def _widen(skills: Tensor, width: int) -> Tensor:
    """[B, L, K] -> [B, L, width], PAD_ID in the added slots."""
    extra = width - skills.shape[-1]
    return skills if extra <= 0 else F.pad(skills, (0, extra), value=PAD_ID)


def _check_inference(model: KTModel) -> None:
    if model.training:
        raise ValueError("the step path is for inference: call model.eval() first")


@torch.no_grad()
def start_state(model: KTModel, questions: Tensor, skills: Tensor, responses: Tensor,
                window: int | None = None) -> StepState:
    """The state after a left-padded history batch: questions, responses [B, L], skills [B, L] or
    [B, L, K]; each learner's last W - 1 interactions are kept (W: `window`, default cfg.max_len)."""
    _check_inference(model)
    window = window or model.config.max_len
    if not 1 <= window <= model.config.max_len:
        raise ValueError(f"window {window} must be in [1, max_len {model.config.max_len}] (the biases' tables)")
    skills = as_sets(skills)
    if model.config.band:
        return _band_start(model, questions, skills, responses)
    keep = max(window - 1, 0)
    start = max(questions.shape[1] - keep, 0)
    questions, skills, responses = questions[:, start:], skills[:, start:], responses[:, start:]
    valid = present(skills)                                                   # [B, L]
    if bool((valid[:, :-1] & ~valid[:, 1:]).any()):
        raise ValueError("the history must be left-padded (no padding after an interaction)")
    used = valid.any(0).nonzero()
    first = int(used[0]) if len(used) else questions.shape[1]                 # drop all-padding columns
    state = StepState(questions[:, first:], skills[:, first:], responses[:, first:], window)
    kind = stepping(model)
    if kind is Stepping.ATTENTION:
        empty = LayerCache(valid=valid[:, :0])
        state.layers = empty if state.questions.shape[1] == 0 else append_rows(
            model, empty, state.questions, state.skills, state.responses)
    elif kind is Stepping.RECURRENT:
        inputs, seen = model.history_inputs(state.skills, state.responses)       # [B, P+1, d], [B, 1]
        packed = pack_padded_sequence(inputs, (seen[:, 0] + 1).cpu(), batch_first=True, enforce_sorted=False)
        _, state.recurrent = model.lstm(packed)
    return state


def _band_start(model: KTModel, questions: Tensor, skills: Tensor, responses: Tensor) -> StepState:
    """A band model's state after a whole left-padded history (its last W - 1 ids kept for reference)."""
    keep = model.config.max_len - 1
    valid = present(skills)
    if bool((valid[:, :-1] & ~valid[:, 1:]).any()):
        raise ValueError("the history must be left-padded (no padding after an interaction)")
    state = StepState(questions[:, -keep:], skills[:, -keep:], responses[:, -keep:], model.config.max_len)
    kind = stepping(model)
    if kind is Stepping.ATTENTION:
        state.layers = band_state(model, questions, skills, responses)
    elif kind is Stepping.RECURRENT:
        inputs, seen = model.history_inputs(skills, responses)                    # [B, L+1, d], [B, 1]
        packed = pack_padded_sequence(inputs, (seen[:, 0] + 1).cpu(), batch_first=True, enforce_sorted=False)
        _, state.recurrent = model.lstm(packed)
    return state


def append_rows(model: KTModel, cache: LayerCache, questions: Tensor, skills: Tensor,
                responses: Tensor) -> LayerCache:
    """The cache grown by rows questions, responses [B, k], skills [B, k, K] (the model's own
    compute on those rows alone; its logits, all at history positions, are not computed). Rows
    without an interaction are allowed before the first one (left padding: never visible). A band
    model keeps the last W - 1 columns (its rolling buffer)."""
    ctx = StepContext.append(cache, present(skills), band=model.config.band)
    model.compute(questions, skills, responses.clamp(0, 1), ctx, Collector(), read_from=questions.shape[1])
    return ctx.stored.last(model.config.max_len - 1) if model.config.band else ctx.stored


@torch.no_grad()
def step(model: KTModel, state: StepState, questions: Tensor, skills: Tensor, responses: Tensor) -> StepState:
    """The state after each learner's next k interactions: questions, responses [B, k] (0/1), skills
    [B, k] or [B, k, K], oldest first. Past the window edge: rebuilt from the last W - 1 (module doc)."""
    _check_inference(model)
    skills = as_sets(skills)
    if not bool(present(skills).all()):
        raise ValueError("every appended row must be an interaction (a non-empty skill set)")
    width = max(state.skills.shape[-1], skills.shape[-1])
    all_q = torch.cat([state.questions, questions], dim=1)                           # [B, P+k]
    all_s = torch.cat([_widen(state.skills, width), _widen(skills, width)], dim=1)   # [B, P+k, K]
    all_r = torch.cat([state.responses, responses], dim=1)
    band = bool(model.config.band)
    if all_q.shape[1] > state.window - 1 and not band:
        return start_state(model, all_q, all_s, all_r, state.window)
    keep = state.window - 1
    grown = StepState(all_q[:, -keep:], all_s[:, -keep:], all_r[:, -keep:], state.window, rebuilt=False)
    kind = stepping(model)
    if kind is Stepping.ATTENTION:
        grown.layers = append_rows(model, state.layers, questions, _widen(skills, width), responses)
    elif kind is Stepping.RECURRENT:
        grown.recurrent = append_recurrent(model, state.recurrent, skills, responses)
    return grown


def append_recurrent(model: DKT, recurrent: tuple[Tensor, Tensor], skills: Tensor,
                     responses: Tensor) -> tuple[Tensor, Tensor]:
    """The LSTM state (h, c) [1, B, hidden] moved on by interactions skills [B, k, K], responses [B, k]."""
    e = embed_set(model.interaction, skills, 2 * skills + responses.clamp(0, 1).unsqueeze(-1))   # [B, k, d]
    return model.lstm(e, recurrent)[1]


@torch.no_grad()
def predict_next(model: KTModel, state: StepState, candidate_questions: Tensor, candidate_skills: Tensor) -> Tensor:
    """P(correct) [B, C] of each candidate (questions [B, C], skills [B, C] or [B, C, K]) right
    after the state's history: what the full path gives (padding candidates: meaningless)."""
    _check_inference(model)
    candidate_skills = as_sets(candidate_skills)
    kind = stepping(model)
    if kind is Stepping.ATTENTION:
        logits = cached_logits(model, state.layers, candidate_questions, candidate_skills)
    elif kind is Stepping.RECURRENT:
        logits = recurrent_logits(model, state.recurrent[0][-1], candidate_skills)
    else:
        logits = _recompute(model, state, candidate_questions, candidate_skills)
    return torch.sigmoid(logits.float())


def recurrent_logits(model: DKT, hidden: Tensor, candidate_skills: Tensor) -> Tensor:
    """Logits [B, C] of candidate skill sets [B, C, K] from the LSTM's last hidden state [B, hidden]."""
    scores = model.out(model.drop(hidden)).unsqueeze(1)                          # [B, 1, n_skills]
    return set_scores(scores.expand(-1, candidate_skills.shape[1], -1), candidate_skills)


def _recompute(model: KTModel, state: StepState, candidate_questions: Tensor, candidate_skills: Tensor) -> Tensor:
    """Logits [B, C] from full forwards: the rank forward, or one window [history, candidate] per
    candidate where the model has none (a leaking routing scope)."""
    width = max(state.skills.shape[-1], candidate_skills.shape[-1])
    skills, candidate_skills = _widen(state.skills, width), _widen(candidate_skills, width)
    if not model.config.leaks_future:
        return model.rank(state.questions, skills, state.responses, candidate_questions, candidate_skills)
    B, C = candidate_questions.shape
    q, s, r = (x.repeat_interleave(C, dim=0) for x in (state.questions, skills, state.responses))   # [B*C, P, ...]
    q = torch.cat([q, candidate_questions.reshape(B * C, 1)], dim=1)                  # [B*C, P+1]
    s = torch.cat([s, candidate_skills.reshape(B * C, 1, width)], dim=1)             # [B*C, P+1, K]
    r = torch.cat([r, torch.full_like(q[:, :1], CANDIDATE_RESPONSE)], dim=1)
    return model(q, s, r).logits[:, -1].reshape(B, C)
