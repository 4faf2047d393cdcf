"""The step path (training/models/step.py) gives the full path's candidate probabilities (the served
rank forward on each learner's last window - 1 interactions) for every preset, the router options
that are no preset and the full-recompute fallback: appending one interaction at a time through
every history length up to past the window edge, several at a time, in one jump over the edge and
from an empty history; C = 1 and C = 5 candidates, learners of different lengths in one batch,
multi-skill sets. Past the edge the state is rebuilt (the rule of the module docstring); a leaking
routing scope falls back to full forwards."""
import pytest
import torch

import training.models.step as step_module
from routerkt.contract.signature import PAD_ID, PAD_RESPONSE
from tests.tiny_models import random_tiny_model
from training.config import Context, ExpertKind, RoutingScope
from training.models.registry import PRESETS
from training.models.step import Stepping, predict_next, start_state, step, stepping

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]
TOL = 1e-5
NQ, NS, W = 40, 12, 12
LONGEST = 2 * W + 3                 # the first learner passes through every length 1 .. LONGEST
START = (0, 3, 8)                   # the learners' history lengths before the first step
VARIANTS = {name: (name, {}) for name in PRESETS} | {
    "routerkt-akt+token": ("routerkt-akt", {"routing_scope": RoutingScope.TOKEN}),
    "routerkt-akt+ffn": ("routerkt-akt", {"experts": ExpertKind.FFN}),
    "routerkt-akt+person_topk": ("routerkt-akt", {"person_topk": True}),
    "routerkt-cl4kt-qn+person_topk": ("routerkt-cl4kt-qn", {"person_topk": True}),
    "routerkt-akt+sequence": ("routerkt-akt", {"routing_scope": RoutingScope.SEQUENCE}),   # falls back
}




def _model(variant: str, frozen: bool = False):
    """A tiny 2-block model of `variant` as a WINDOW model (a preset that is a band model by default too: band
    models have their own parity tests, tests/unit/test_band_models.py) with random weights and a non-zero
    question-difficulty term."""
    preset, options = VARIANTS[variant]
    model = random_tiny_model(preset, NQ, NS, W, n_blocks=2, **{"context": Context.WINDOW, **options})
    if frozen:
        model.freeze_biases()
    return model


def _interactions(B: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """questions, responses [B, n]; skill sets [B, n, 2] of one or two skills."""
    g = torch.Generator().manual_seed(seed)
    q, r = torch.randint(2, NQ, (B, n), generator=g), torch.randint(0, 2, (B, n), generator=g)
    s = torch.randint(2, NS, (B, n, 2), generator=g)
    s[..., 1] = torch.where(torch.rand(B, n, generator=g) < 0.4, s[..., 1], PAD_ID)
    return q, s, r


def _learners(seed: int = 1) -> list[tuple[torch.Tensor, ...]]:
    """Per learner: its whole history (questions [n], skills [n, 2], responses [n])."""
    return [tuple(x[0] for x in _interactions(1, start + LONGEST, seed + i)) for i, start in enumerate(START)]


def _left_padded(rows: list[tuple[torch.Tensor, ...]], length: int) -> list[torch.Tensor]:
    """Each learner's last `length` interactions, left-padded to `length`: [B, length(, 2)] per field."""
    out = []
    for k, pad in enumerate((PAD_ID, PAD_ID, PAD_RESPONSE)):
        fields = []
        for row in rows:
            kept = row[k][max(0, len(row[k]) - length):]
            fields.append(torch.cat([torch.full((length - len(kept), *kept.shape[1:]), pad, dtype=kept.dtype), kept]))
        out.append(torch.stack(fields))
    return out


def _full(model, learners, seen: list[int], cq, cs) -> torch.Tensor:
    """The served path: one rank forward on each learner's last W - 1 of its first `seen` interactions."""
    history = _left_padded([tuple(x[:n] for x in row) for row, n in zip(learners, seen)], W - 1)
    with torch.no_grad():
        if model.config.leaks_future:                     # no rank forward: one window per candidate
            return _windows(model, history, cq, cs)
        return torch.sigmoid(model.rank(*history, cq, cs))


def _windows(model, history, cq, cs) -> torch.Tensor:
    B, C = cq.shape
    rows = [x.repeat_interleave(C, 0) for x in history]
    q = torch.cat([rows[0], cq.reshape(-1, 1)], 1)
    s = torch.cat([rows[1], cs.reshape(B * C, 1, -1)], 1)
    r = torch.cat([rows[2], torch.zeros(B * C, 1, dtype=torch.long)], 1)
    return torch.sigmoid(model(q, s, r).logits[:, -1]).reshape(B, C)


def _candidates(C: int, seed: int, B: int = len(START)) -> tuple[torch.Tensor, torch.Tensor]:
    q, s, _ = _interactions(B, C, seed)
    return q, s


def _run(model, chunks: list[int]) -> float:
    """Start from the learners' first START interactions, append `chunks` interactions per call;
    after each call compare C = 5 and C = 1 candidates with the full path. Returns the worst gap."""
    learners = _learners()
    seen = list(START)
    state = start_state(model, *_left_padded([tuple(x[:n] for x in row) for row, n in zip(learners, seen)], max(START)))
    worst = 0.0
    for call, k in enumerate(chunks):
        new = [torch.stack([row[f][n:n + k] for row, n in zip(learners, seen)]) for f in range(3)]
        state = step(model, state, *new)
        seen = [n + k for n in seen]
        assert state.rebuilt == (max(seen) > W - 1)                       # the window-edge rule
        for C in (5, 1):
            cq, cs = _candidates(C, seed=100 + call)
            gap = (predict_next(model, state, cq, cs) - _full(model, learners, seen, cq, cs)).abs().max().item()
            worst = max(worst, gap)
    return worst


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_one_at_a_time_through_the_window_edge(variant):
    model = _model(variant)
    assert _run(model, [1] * LONGEST) < TOL


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_several_at_a_time_and_one_jump_over_the_edge(variant):
    model = _model(variant)
    assert _run(model, [2, 3, 1, W + 2, 4, 5]) < TOL


def test_frozen_relative_tables():
    """The exported form (relative recency tables frozen to [H, Lmax, Lmax] constants)."""
    assert _run(_model("relative-akt", frozen=True), [1] * (W + 2)) < TOL


def test_every_preset_steps_incrementally_and_a_leaking_scope_recomputes():
    kinds = {name: stepping(_model(name)) for name in PRESETS}
    assert kinds["dkt"] is Stepping.RECURRENT
    assert all(kind is Stepping.ATTENTION for name, kind in kinds.items() if name != "dkt")
    assert stepping(_model("routerkt-akt+sequence")) is Stepping.RECOMPUTE


@pytest.mark.parametrize("variant", ["routerkt-akt", "dkt"])
def test_the_cached_history_matters(variant):
    """The test can fail: a state built from other responses gives other probabilities."""
    model = _model(variant)
    q, s, r = _interactions(2, 6, seed=7)
    cq, cs = _candidates(2, seed=8, B=2)
    base = predict_next(model, start_state(model, q, s, r), cq, cs)
    flipped = predict_next(model, start_state(model, q, s, 1 - r), cq, cs)
    assert (base - flipped).abs().max().item() > 1e-4


def test_appended_rows_must_be_interactions_and_the_model_in_eval_mode():
    model = _model("akt")
    q, s, r = _interactions(2, 4, seed=9)
    state = start_state(model, q, s, r)
    s2 = s[:, :1].clone()
    s2[0] = PAD_ID
    with pytest.raises(ValueError, match="interaction"):
        step(model, state, q[:, :1], s2, r[:, :1])
    with pytest.raises(ValueError, match="eval"):
        step(model.train(), state, q[:, :1], s[:, :1], r[:, :1])


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_from_an_empty_history(variant):
    """No history at all (the candidate sees itself only), then a first interaction."""
    model = _model(variant)
    q, s, r = _interactions(2, 1, seed=10)
    cq, cs = _candidates(3, seed=11, B=2)
    state = start_state(model, q[:, :0], s[:, :0], r[:, :0])
    empty = _left_padded([(q[b, :0], s[b, :0], r[b, :0]) for b in range(2)], W - 1)
    pad = [torch.cat([x, y], 1) for x, y in zip(empty, (q, s, r))]
    for stepped, history in ((state, empty), (step(model, state, q, s, r), [x[:, 1:] for x in pad])):
        with torch.no_grad():
            full = _windows(model, history, cq, cs)
        assert (predict_next(model, stepped, cq, cs) - full).abs().max().item() < TOL


def test_the_recompute_fallback_is_the_rank_forward(monkeypatch):
    """A backbone the step path does not know keeps its history and runs the full rank forward."""
    monkeypatch.setattr(step_module, "stepping", lambda model: Stepping.RECOMPUTE)
    model = _model("akt")
    assert _run(model, [1] * (W + 1)) < TOL
