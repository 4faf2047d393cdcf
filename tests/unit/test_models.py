"""Model invariants: router (shared heads weight 1, exactly K dynamic heads per token, balance loss at
uniform routing), ALiBi slopes, gradients through monotonic attention, fused == explicit attention,
frozen biases == learned biases, registry and presets."""
import math

import pytest
import torch

from routerkt.errors import UserError
from training.config import (
    AttentionKind,
    ExpertKind,
    HeadMode,
    ModelConfig,
    RouterScoring,
    RoutingScope,
)
from training.models.biases import alibi_slopes, alibi_table
from training.models.context import MaskKind, SequenceContext
from training.models.registry import PRESETS, build_model, preset_config, with_vocab
from training.models.router import Router

pytestmark = pytest.mark.unit


def _inputs(B=3, L=16, nq=30, ns=10, pad=(0, 4, 9), seed=0, K=1):
    """questions, responses [B, L] and skill sets [B, L, K] (K > 1: 1..K skills per position)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(2, nq, (B, L), generator=g)
    s = torch.randint(2, ns, (B, L, 1), generator=g)
    r = torch.randint(0, 2, (B, L), generator=g)
    if K > 1:
        extra = torch.randint(2, ns, (B, L, K - 1), generator=g)
        sizes = torch.randint(1, K + 1, (B, L, 1), generator=g)
        s = torch.cat([s, extra], -1).masked_fill(torch.arange(K) >= sizes, 0)
    for b, p in enumerate(pad[:B]):
        q[b, :p], s[b, :p], r[b, :p] = 0, 0, -1
    return q, s, r


@pytest.mark.parametrize("scope", list(RoutingScope))
def test_router_shared_heads_weight_one_and_k_selected(scope):
    torch.manual_seed(0)
    router = Router(d_model=16, n_experts=8, n_shared=2, n_selected=3, scope=scope)
    _, s, _ = _inputs()
    ctx = SequenceContext.build(s)
    out = router(torch.randn(3, 16, 16), ctx)
    valid = ctx.valid
    assert torch.all(out.token_weights[..., :2] == 1.0)
    assert torch.all(out.selected.sum(-1) == 3)                       # exactly K dynamic heads per token
    dyn = out.token_weights[..., 2:]
    assert torch.all((dyn > 0).sum(-1) == 3)                          # unselected heads get weight 0
    w = out.weights if scope is not RoutingScope.SEQUENCE else out.weights.expand_as(out.token_weights)
    assert torch.allclose(w[..., :2][valid], torch.ones_like(w[..., :2][valid]))
    if scope is RoutingScope.PREFIX:                                  # mean over valid positions <= t
        b, t = 1, 10
        ref = out.token_weights[b, 4:t + 1].mean(0)
        assert torch.allclose(out.weights[b, t], ref, atol=1e-6)


def test_query_norm_scores_are_standardised_head_norms_without_parameters():
    torch.manual_seed(0)
    router = Router(d_model=16, n_experts=8, n_shared=2, n_selected=3, scope=RoutingScope.TOKEN,
                    scoring=RouterScoring.QUERY_NORM)
    assert list(router.parameters()) == []                            # no router parameter
    h = torch.randn(3, 5, 16)
    norms = h.view(3, 5, 8, 2)[:, :, 2:].norm(dim=-1)                  # dynamic heads' query norms
    ref = torch.softmax(norms / norms.std(-1, unbiased=True, keepdim=True), dim=-1)   # the reference formula
    assert torch.allclose(router.scores(h), ref, atol=1e-6)
    _, s, _ = _inputs(L=5)
    out = router(h, SequenceContext.build(s))
    assert torch.all(out.selected.sum(-1) == 3)


def test_query_norm_equal_norms_give_uniform_gates_and_finite_gradients():
    """The reference divides by a zero std (NaN); ours floors it: equal norms -> uniform gates."""
    for n_shared in (1, 7):                                           # D = 7, and D = 1 (std of one value)
        router = Router(d_model=16, n_experts=8, n_shared=n_shared, n_selected=1, scope=RoutingScope.TOKEN,
                        scoring=RouterScoring.QUERY_NORM)
        for h in (torch.ones(1, 4, 16), torch.zeros(1, 4, 16)):
            h = h.requires_grad_()
            gates = router.scores(h)
            D = 8 - n_shared
            assert torch.allclose(gates, torch.full_like(gates, 1.0 / D))
            (gates * torch.arange(D, dtype=gates.dtype)).sum().backward()
            assert torch.isfinite(h.grad).all()


def test_person_topk_selects_from_the_prefix_mean_gate():
    torch.manual_seed(0)
    router = Router(d_model=16, n_experts=8, n_shared=2, n_selected=3, scope=RoutingScope.PREFIX, person_topk=True)
    _, s, _ = _inputs()
    ctx = SequenceContext.build(s)
    out = router(torch.randn(3, 16, 16), ctx)
    valid = ctx.valid
    assert torch.all(out.weights[..., :2][valid] == 1.0)
    assert torch.all(out.selected.sum(-1) == 3)
    assert torch.all((out.weights[..., 2:][valid] > 0).sum(-1) == 3)   # exactly K dynamic heads per person and t
    b, t = 1, 10                                                        # row 1 has 4 padding positions
    person = out.token_weights[b, 4:t + 1, 2:].mean(0)                  # prefix mean of the gates
    top = person.topk(3).indices
    expected = torch.zeros(6).index_fill(0, top, 1.0) * person
    assert torch.allclose(out.weights[b, t, 2:], expected, atol=1e-6)
    # per person, not per token: the selection at t is generally not the token's own top-K
    token_top = out.token_weights[..., 2:].topk(3, dim=-1).indices.sort(-1).values
    person_top = out.weights[..., 2:].topk(3, dim=-1).indices.sort(-1).values
    assert (token_top != person_top)[valid].any()


@pytest.mark.parametrize("scope", [RoutingScope.TOKEN, RoutingScope.SEQUENCE])
def test_person_topk_needs_the_prefix_scope(scope):
    with pytest.raises(ValueError, match="person_topk"):
        Router(d_model=16, n_experts=8, n_shared=1, n_selected=2, scope=scope, person_topk=True)


def test_query_norm_is_refused_for_ffn_experts():
    cfg = with_vocab(ModelConfig(heads=HeadMode.ROUTER, experts=ExpertKind.FFN,
                                 router_scoring=RouterScoring.QUERY_NORM), 30, 10)
    with pytest.raises(ValueError, match="FFN experts"):
        build_model(cfg)


def test_balance_loss_uniform_routing_equals_one_over_dynamic():
    router = Router(d_model=8, n_experts=8, n_shared=1, n_selected=1, scope=RoutingScope.TOKEN)
    with torch.no_grad():
        router.gate.weight.zero_()                                    # every gate = 1/7
    D = 7
    s = torch.full((1, D * 10, 1), 5)
    ctx = SequenceContext.build(s)
    h = torch.zeros(1, D * 10, 8)
    out = router(h, ctx)
    # gates are exactly uniform -> P_i = 1/D; the shares sum to 1 -> loss = sum f_i / D = 1/D
    assert math.isclose(out.balance.item(), 1.0 / D, rel_tol=1e-6)
    # and when routing collapses on one expert the loss is larger
    with torch.no_grad():
        router.gate.weight.zero_()
        router.gate.weight[0, 0] = 50.0
    collapsed = router(torch.ones(1, D * 10, 8), ctx).balance.item()
    assert collapsed > 0.9


def test_alibi_slopes():
    assert alibi_slopes(8) == [2.0 ** -(h + 1) for h in range(8)]      # 1/2 ... 1/256
    assert alibi_slopes(4) == [2.0 ** (-2 * (h + 1)) for h in range(4)]
    six = alibi_slopes(6)                                              # 4 of H=4, then every other of H=8
    assert six[:4] == alibi_slopes(4) and six[4:] == [2.0 ** -1, 2.0 ** -3]
    assert len(alibi_slopes(12)) == 12 and len(set(alibi_slopes(12))) == 12
    table = alibi_table(8, 5)
    assert table.shape == (8, 5, 5) and table[0, 4, 1].item() == -0.5 * 3


def test_monotonic_gradients_reach_decay_and_query_key():
    cfg = with_vocab(preset_config("akt"), 30, 10)
    model = build_model(cfg).train()
    q, s, r = _inputs()
    out = model(q, s, r)
    (out.logits.sum() + out.aux_loss).backward()
    for layer in [*model.knowledge_encoder, *model.question_encoder, *model.retriever]:
        attn = layer.attn
        assert attn.gamma.grad is not None and attn.gamma.grad.abs().sum() > 0
        assert attn.qk.weight.grad is not None and attn.qk.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("attention", list(AttentionKind))
@pytest.mark.parametrize("heads", list(HeadMode))
def test_fused_equals_explicit_attention(attention, heads):
    cfg = with_vocab(ModelConfig(attention=attention, heads=heads), 30, 10)
    model = build_model(cfg).eval()
    q, s, r = _inputs()
    with torch.no_grad():
        fused = model(q, s, r).logits
        explicit = model(q, s, r, return_attention=True).logits
    assert torch.allclose(fused, explicit, atol=1e-5)


def test_relative_frozen_kernel_equals_learned():
    cfg = with_vocab(preset_config("relative-akt"), 30, 10)
    model = build_model(cfg).eval()
    q, s, r = _inputs()
    with torch.no_grad():
        before = model(q, s, r).logits
        model.freeze_biases()
        after = model(q, s, r).logits
    assert model.retriever[0].attn.get_buffer("frozen_recency_past").shape == (8, cfg.table_len, cfg.table_len)
    assert torch.allclose(before, after, atol=1e-6)


def test_attention_rows_without_keys_are_zero_and_rows_sum_to_one():
    cfg = with_vocab(preset_config("akt-standard"), 30, 10)
    model = build_model(cfg).eval()
    q, s, r = _inputs()
    with torch.no_grad():
        out = model(q, s, r, return_attention=True)
    retriever = out.attention[out.attention_names.index("retriever.0")]      # PAST mask
    first = [0, 4, 9]
    for b, f in enumerate(first):
        assert retriever[b, :, f].abs().sum() == 0                          # first real position sees nothing
        assert retriever[b, :, :f].abs().sum() == 0                         # padding rows are zero
        assert torch.allclose(retriever[b, :, f + 1:].sum(-1), torch.ones(8, 16 - f - 1))
        assert retriever[b, :, f + 1:, :f].abs().sum() == 0                 # no weight on padding keys


def test_ffn_experts_variant_routes_ffn_not_heads():
    cfg = with_vocab(ModelConfig(heads=HeadMode.ROUTER, experts=ExpertKind.FFN), 30, 10)
    model = build_model(cfg)
    assert model.retriever[0].attn.router is None
    assert model.retriever[0].ffn.router is not None
    q, s, r = _inputs()
    out = model(q, s, r, return_routing=True)
    assert "balance" in out.aux and len(out.routing) == 4               # knowledge encoder 2 + retriever 2


def test_presets_and_registry():
    assert {"routerkt-akt", "routerkt-cl4kt", "routerkt-simplekt", "akt", "akt-standard", "alibi-akt",
            "folibi-akt", "folibi-cl4kt", "relative-akt", "cl4kt", "simplekt", "dkt"} <= set(PRESETS)
    cfg = preset_config("routerkt-akt")
    assert (cfg.heads, cfg.attention, cfg.n_shared, cfg.n_selected, cfg.balance_beta) == \
        (HeadMode.ROUTER, AttentionKind.STANDARD, 1, 2, 0.01)
    cl4kt, standard = preset_config("cl4kt"), preset_config("cl4kt-standard")
    assert (standard.backbone, standard.attention, standard.heads) == (cl4kt.backbone, AttentionKind.STANDARD,
                                                                       HeadMode.DENSE)
    assert standard.contrastive and standard.dropout == cl4kt.dropout
    # query-norm routing is its own preset; every other preset keeps the learned gate
    assert preset_config("routerkt-cl4kt-qn").router_scoring is RouterScoring.QUERY_NORM
    assert {n for n in PRESETS if preset_config(n).router_scoring is not RouterScoring.LEARNED} == {"routerkt-cl4kt-qn"}
    assert not any(preset_config(n).person_topk for n in PRESETS)
    with pytest.raises(UserError, match="unknown preset"):
        preset_config("nope")


@pytest.mark.parametrize(("name", "encoders", "retriever"), [
    ("folibi-akt", ("knowledge_encoder", "question_encoder"), "retriever"),
    ("folibi-cl4kt", ("question_encoder", "interaction_encoder"), "retriever"),
])
def test_folibi_puts_alibi_in_the_retriever_and_monotonic_encoders(name, encoders, retriever):
    """FoLiBi's placement (choose_enc="f"): ALiBi only in the retriever; the alibi-* preset has it everywhere."""
    folibi = build_model(with_vocab(preset_config(name), 30, 10))
    everywhere = build_model(with_vocab(preset_config(name.replace("folibi", "alibi")), 30, 10))
    for stack in encoders:
        assert {layer.attn.kind for layer in getattr(folibi, stack)} == {AttentionKind.MONOTONIC}
        assert {layer.attn.kind for layer in getattr(everywhere, stack)} == {AttentionKind.ALIBI}
    assert {layer.attn.kind for layer in getattr(folibi, retriever)} == {AttentionKind.ALIBI}
    # the monotonic encoders train their decay: gamma gets a gradient
    q, s, r = _inputs()
    folibi(q, s, r).logits.sum().backward()
    gammas = [layer.attn.gamma.grad for stack in encoders for layer in getattr(folibi, stack)]
    assert all(g is not None and g.abs().sum() > 0 for g in gammas)


def test_configs_recorded_without_encoder_attention_load_as_every_stack():
    from training.config import EncoderAttention, from_dict, to_dict
    recorded = to_dict(preset_config("alibi-akt"))
    del recorded["encoder_attention"]
    cfg = from_dict(ModelConfig, recorded)
    assert cfg.encoder_attention is EncoderAttention.SAME and cfg.encoder_kind is AttentionKind.ALIBI
