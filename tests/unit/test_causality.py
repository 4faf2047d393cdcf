"""Exact causality for every preset (dropout off): the prediction at position t must not change when
the response at t, any later question or skill, or the amount of left padding changes. Also for
every variant of `routerkt reproduce` (training/paper/variants.py), the explicit (non-fused) attention
path, a non-zero Rasch difficulty term (zero at initialisation, so untested otherwise) and the router
options that are no preset (person-level top-K, query-norm scoring elsewhere)."""
import dataclasses

import pytest
import torch

from training.config import (
    ModelConfig,
    RouterScoring,
    RoutingScope,
    RunConfig,
    apply_overrides,
)
from training.models.registry import PRESETS, build_model, preset_config, with_vocab
from training.paper.variants import GROUPS

pytestmark = pytest.mark.unit
TOL = 1e-6
NQ, NS = 40, 12


def _model(name: str, **overrides):
    torch.manual_seed(0)
    cfg = with_vocab(preset_config(name), NQ, NS)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return build_model(cfg).eval()


def _batch(B=3, L=24, seed=1, K=3):
    """questions, responses [B, L]; skill sets [B, L, K] of 1..K skills (multi-skill interactions)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(2, NQ, (B, L), generator=g)
    s = torch.randint(2, NS, (B, L, K), generator=g)
    r = torch.randint(0, 2, (B, L), generator=g)
    sizes = torch.randint(1, K + 1, (B, L, 1), generator=g)
    s = s.masked_fill(torch.arange(K) >= sizes, 0)
    for b, pad in enumerate([0, 5, 11][:B]):      # different padding per row
        q[b, :pad], s[b, :pad], r[b, :pad] = 0, 0, -1
    return q, s, r


def _probs(model, q, s, r):
    with torch.no_grad():
        return torch.sigmoid(model(q, s, r).logits)


def _assert_no_leak(model):
    q, s, r = _batch()
    base = _probs(model, q, s, r)
    L = q.shape[1]
    for t in (12, 17, L - 2):
        r2 = r.clone()
        r2[:, t:] = torch.where(r2[:, t:] >= 0, 1 - r2[:, t:], r2[:, t:])    # flip responses at >= t
        q2, s2 = q.clone(), s.clone()
        q2[:, t + 1:] = torch.randint(2, NQ, q2[:, t + 1:].shape)             # change later questions/skills
        s2[:, t + 1:] = torch.randint(2, NS, s2[:, t + 1:].shape)
        moved = _probs(model, q2, s2, r2)
        diff = (moved - base).abs() * (s != 0).any(-1)                       # predictions at padding are unused
        assert diff[:, : t + 1].max().item() < TOL
        assert diff[:, t + 1:].max().item() > 0                               # the test can fail


def _assert_padding_free(model):
    q, s, r = _batch(B=3, L=24)
    base = _probs(model, q, s, r)
    extra = 9
    pad = lambda x, v: torch.cat([torch.full((x.shape[0], extra, *x.shape[2:]), v, dtype=x.dtype), x], dim=1)
    longer = _probs(model, pad(q, 0), pad(s, 0), pad(r, -1))[:, extra:]
    valid = (s != 0).any(-1)
    assert (longer - base)[valid].abs().max().item() < TOL
    trimmed = _probs(model, q[:, 5:], s[:, 5:], r[:, 5:])               # rows 1, 2 lose only padding
    assert (trimmed[1:] - base[1:, 5:])[valid[1:, 5:]].abs().max().item() < TOL


@pytest.mark.parametrize("name", list(PRESETS))
def test_response_at_t_and_future_do_not_leak(name):
    _assert_no_leak(_model(name))


@pytest.mark.parametrize("name", list(PRESETS))
def test_left_padding_amount_does_not_matter(name):
    _assert_padding_free(_model(name))


# ----------------------------------------------------------------------------------------------
# variants, the explicit attention path, a trained-looking Rasch difficulty; tiny widths (fast)

TINY = {"d_model": 32, "n_heads": 8, "n_blocks": 1, "d_ff": 32, "final_fc": 32, "final_fc2": 16, "lstm_hidden": 16}
VARIANTS = sorted({v for group in GROUPS.values() for v in group}, key=str)


def _tiny(model_cfg: ModelConfig, rasch: bool, **overrides):
    torch.manual_seed(0)
    model = build_model(dataclasses.replace(with_vocab(model_cfg, NQ, NS), **TINY, **overrides)).eval()
    table = getattr(model, "difficulty", None)
    if rasch:
        assert table is not None, "this backbone has no difficulty table"
        with torch.no_grad():                        # every row, the padding and unknown ids included
            table.weight.copy_(torch.randn(table.weight.shape, generator=torch.Generator().manual_seed(5)))
    return model


def _has_difficulty(name: str) -> bool:
    return hasattr(build_model(with_vocab(preset_config(name), NQ, NS)), "difficulty")


CASES = [pytest.param(name, fused, _has_difficulty(name), id=f"{name}-{'fused' if fused else 'explicit'}")
         for name in PRESETS for fused in (True, False)]


@pytest.mark.parametrize(("name", "fused", "rasch"), CASES)
def test_attention_paths_and_rasch_difficulty_stay_causal(name, fused, rasch):
    model = _tiny(preset_config(name), rasch, fused_attention=fused)
    _assert_no_leak(model)
    _assert_padding_free(model)


def test_the_rasch_probe_changes_predictions():
    """The random difficulty table reaches the logits (else the Rasch cases above prove nothing)."""
    q, s, r = _batch()
    plain, rasch = _tiny(preset_config("akt"), False), _tiny(preset_config("akt"), True)
    assert (_probs(plain, q, s, r) - _probs(rasch, q, s, r)).abs().max().item() > 1e-3


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "explicit"])
def test_every_reproduce_variant_is_causal(variant, fused):
    cfg = apply_overrides(RunConfig(preset=variant.preset, model=preset_config(variant.preset)), list(variant.overrides))
    model = _tiny(cfg.model, _has_difficulty(variant.preset), fused_attention=fused)
    if cfg.model.leaks_future:                       # the paper's whole-window routing: must be caught
        q, s, r = _batch()
        r2 = r.clone()
        r2[:, 20:] = 1 - r2[:, 20:].clamp(min=0)
        assert (_probs(model, q, s, r2) - _probs(model, q, s, r))[:, :20].abs().max().item() > TOL
        return
    _assert_no_leak(model)
    _assert_padding_free(model)


# router options that are no preset of their own (issue 15): query-norm scoring on other backbones
# and scopes, and the person-level top-K of the prefix scope
ROUTER_OPTIONS = [
    ("routerkt-akt", {"person_topk": True}),
    ("routerkt-cl4kt", {"person_topk": True}),
    ("routerkt-cl4kt-qn", {"person_topk": True}),
    ("routerkt-simplekt", {"person_topk": True, "n_selected": 1}),
    ("routerkt-akt", {"router_scoring": RouterScoring.QUERY_NORM}),
    ("routerkt-cl4kt-qn", {"routing_scope": RoutingScope.TOKEN}),
]


def _option_id(name: str, opts: dict) -> str:
    return "+".join([name, *(f"{k}={getattr(v, 'value', v)}" for k, v in opts.items())])


OPTION_CASES = [pytest.param(name, opts, fused, id=f"{_option_id(name, opts)}-{'fused' if fused else 'explicit'}")
                for name, opts in ROUTER_OPTIONS for fused in (True, False)]


@pytest.mark.parametrize(("name", "opts", "fused"), OPTION_CASES)
def test_router_options_stay_causal(name, opts, fused):
    model = _tiny(preset_config(name), _has_difficulty(name), fused_attention=fused, **opts)
    _assert_no_leak(model)
    _assert_padding_free(model)


def test_sequence_scope_leaks_and_prefix_does_not():
    """The paper's whole-window routing sees the future: the test above would catch it."""
    q, s, r = _batch()
    r2 = r.clone()
    r2[:, 20:] = 1 - r2[:, 20:].clamp(min=0)
    leaky = _model("routerkt-akt", routing_scope=RoutingScope.SEQUENCE)
    diff = (_probs(leaky, q, s, r2) - _probs(leaky, q, s, r))[:, :20].abs().max().item()
    assert diff > TOL
    causal = _model("routerkt-akt", routing_scope=RoutingScope.PREFIX)
    assert (_probs(causal, q, s, r2) - _probs(causal, q, s, r))[:, :20].abs().max().item() < TOL
