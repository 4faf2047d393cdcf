"""Band models (model.context=band, training/models/band.py) compute one function at any history length:
the reference is the plain causal attention over the WHOLE history with the band mask (every query sees at
most the W - 1 positions before it; bias tables widened to the history), and both the chunked forward
(training, the served-protocol evaluation) and the step path's rolling state (the server) must equal it,
for every preset, at histories of 1, W - 2, W - 1, W, W + 1, 500 and 2000 answers (W = 100), within 1e-5.
A window model's step path past the edge is not the band function (so the test can fail)."""
import dataclasses
import math

import pytest
import torch

from routerkt.contract.signature import PAD_ID
from tests.tiny_models import random_tiny_model
from training.config import AttentionKind, Context, Protocol
from training.models.attention import MultiHeadAttention
from training.models.biases import alibi_slopes, alibi_table
from training.models.context import SequenceContext
from training.models.outputs import Collector
from training.models.registry import PRESETS, run_config
from training.models.step import predict_next, start_state, step

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]
TOL = 1e-5
NQ, NS, W = 40, 12, 100
LENGTHS = (1, W - 2, W - 1, W, W + 1, 500, 2000)
STEPPED = 3                      # the last answers reach the state one step() at a time (1, then 2)




def _widen_tables(model, n: int) -> None:
    """ALiBi tables for n positions (the reference runs the plain layout over the whole history)."""
    for m in model.modules():
        if isinstance(m, MultiHeadAttention) and m.kind is AttentionKind.ALIBI:
            slopes = torch.tensor(alibi_slopes(m.n_heads))
            m.alibi = alibi_table(m.n_heads, n)
            m.alibi_keys = slopes[:, None] * (torch.arange(n, dtype=torch.float32) - (n - 1)) * math.sqrt(m.d_k)


def _history(n: int, seed: int) -> tuple[torch.Tensor, ...]:
    """One learner: questions, responses [1, n]; skill sets [1, n, 2] of one or two skills."""
    g = torch.Generator().manual_seed(seed)
    q, r = torch.randint(2, NQ, (1, n), generator=g), torch.randint(0, 2, (1, n), generator=g)
    s = torch.randint(2, NS, (1, n, 2), generator=g)
    s[..., 1] = torch.where(torch.rand(1, n, generator=g) < 0.4, s[..., 1], PAD_ID)
    return q, s, r


@torch.no_grad()
def _reference(model, q, s, r) -> torch.Tensor:
    """Logits [1, n] of the plain causal layout over the whole sequence with the band mask."""
    if not model.chunked_band:                      # DKT: its LSTM over the whole history
        return model(q, s, r).logits
    _widen_tables(model, q.shape[1])
    try:
        ctx = SequenceContext.build(s, band=model.config.band)
        return model.compute(q, s, r.clamp(0, 1), ctx, Collector())[0]
    finally:
        _widen_tables(model, model.config.table_len)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_band_model_step_and_chunks_equal_the_whole_history(preset):
    model = random_tiny_model(preset, NQ, NS, W, context=Context.BAND)
    worst_forward, worst_step = 0.0, 0.0
    for n in LENGTHS:
        q, s, r = _history(n + 1, seed=n)            # n answers, then the candidate at position n
        ref = _reference(model, q, s, r)             # [1, n + 1]
        with torch.no_grad():
            chunked = model(q, s, r).logits
        worst_forward = max(worst_forward, float((chunked - ref).abs().max()))
        first = max(n - STEPPED, 0)
        state = start_state(model, q[:, :first], s[:, :first], r[:, :first]) if first else \
            start_state(model, q[:, :0], s[:, :0], r[:, :0])
        done = first
        for k in (1, 2):
            if done < n:
                k = min(k, n - done)
                state = step(model, state, q[:, done:done + k], s[:, done:done + k], r[:, done:done + k])
                done += k
        probs = predict_next(model, state, q[:, n:n + 1], s[:, n:n + 1])
        worst_step = max(worst_step, float((probs[0, 0] - torch.sigmoid(ref[0, n])).abs()))
    assert worst_forward <= TOL, f"{preset}: chunked forward vs the whole history: {worst_forward:.2e}"
    assert worst_step <= TOL, f"{preset}: step path vs the whole history: {worst_step:.2e}"


def test_a_window_model_is_not_the_band_function():
    """The same weights as a window model: past the window its step path reads the last W - 1 only, so it
    differs from the band reference (the band test above can fail)."""
    band = random_tiny_model("akt-standard", NQ, NS, W, context=Context.BAND)
    window = random_tiny_model("akt-standard", NQ, NS, W, context=Context.WINDOW)
    window.load_state_dict(band.state_dict())
    q, s, r = _history(2 * W + 1, seed=5)
    ref = _reference(band, q, s, r)
    state = start_state(window, q[:, :2 * W], s[:, :2 * W], r[:, :2 * W])
    probs = predict_next(window, state, q[:, 2 * W:], s[:, 2 * W:])
    assert float((probs[0, 0] - torch.sigmoid(ref[0, 2 * W])).abs()) > 1e-4


def test_a_band_model_sees_beyond_its_band_through_depth():
    """Stacked band layers: the prediction at n depends on an answer more than W - 1 positions back (the
    receptive field grows with depth)."""
    model = random_tiny_model("akt-standard", NQ, NS, W, context=Context.BAND, n_blocks=2)
    q, s, r = _history(3 * W, seed=9)
    with torch.no_grad():
        before = model(q, s, r).logits[0, -1]
        r2 = r.clone()
        r2[0, -(W + 20)] = 1 - r2[0, -(W + 20)]           # beyond one band, inside two
        after = model(q, s, r2).logits[0, -1]
    assert float((before - after).abs()) > 1e-6


def test_band_runs_train_on_whole_histories():
    cfg = run_config("routerkt-akt", "x.csv", ["model.context=band"])
    assert cfg.data.protocol is Protocol.WHOLE and cfg.model.band == cfg.model.max_len
    assert run_config("routerkt-akt", "x.csv").data.protocol is Protocol.WHOLE      # band by default
    window = run_config("routerkt-akt", "x.csv", ["model.context=window"])
    assert window.data.protocol is Protocol.RECENT and window.model.band == 0
    explicit = run_config("routerkt-akt", "x.csv", ["model.context=band", "data.protocol=recent"])
    from routerkt.errors import UserError
    from training.training_run import check_protocol
    with pytest.raises(UserError, match="data.protocol=whole"):
        check_protocol(explicit)
    assert dataclasses.replace(cfg.model).table_len == 2 * cfg.model.max_len
