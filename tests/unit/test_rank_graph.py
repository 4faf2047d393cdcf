"""The rank forward (KTModel.rank, one pass over history + candidates) equals today's per-candidate
windows [history, candidate] for every preset, on both attention paths, before and after freezing
the biases; a candidate's probability does not depend on the other candidates; the signature
names the rank graph."""
import pytest
import torch

from routerkt.contract import signature
from routerkt.contract.signature import CANDIDATE_RESPONSE, PAD_ID, PAD_RESPONSE
from tests.tiny_models import random_tiny_model
from training.config import RoutingScope
from training.models.registry import PRESETS, build_model, preset_config, with_vocab

pytestmark = pytest.mark.unit
TOL = 1e-5           # rank vs windows (export's PARITY_TOL)
EXACT = 1e-6         # one candidate with and without the others
NQ, NS, WINDOW = 40, 12, 12
HISTORY_LENGTHS = (0, 1, 5, WINDOW - 2, WINDOW - 1, WINDOW, WINDOW + 9)   # shorter, equal to, longer


def _model(name: str, fused: bool = True, seed: int = 0, **opts):
    """A tiny model with random weights and a non-zero question-difficulty term."""
    return random_tiny_model(name, NQ, NS, WINDOW, seed=seed, fused_attention=fused, **opts)


def _histories(seed: int = 1) -> list[list[tuple[int, int, int]]]:
    g = torch.Generator().manual_seed(seed)
    return [[(int(torch.randint(2, NQ, (1,), generator=g)), int(torch.randint(2, NS, (1,), generator=g)),
              int(torch.randint(0, 2, (1,), generator=g))) for _ in range(n)] for n in HISTORY_LENGTHS]


def _left_pad(rows: list[list[tuple[int, ...]]], length: int, pad: tuple[int, ...]) -> list[torch.Tensor]:
    """Keep each row's last `length` entries, left-pad with `pad`; one [B, length] tensor per field."""
    kept = [row[len(row) - min(len(row), length):] for row in rows]
    padded = [[pad] * (length - len(row)) + row for row in kept]
    return [torch.tensor([[entry[k] for entry in row] for row in padded]) for k in range(len(pad))]


def _history_tensors(histories):
    q, s, r = _left_pad(histories, WINDOW - 1, (PAD_ID, PAD_ID, PAD_RESPONSE))
    return q, s.unsqueeze(-1), r                        # one-skill sets [B, H, 1]


def _candidates(B: int, N: int, seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, NQ, (B, N), generator=g), torch.randint(2, NS, (B, N, 1), generator=g)


def _windows_reference(model, histories, cq, cs) -> torch.Tensor:
    """Today's serving: one left-padded window [last window-1 interactions, candidate] per candidate."""
    rows = [history[max(0, len(history) - (WINDOW - 1)):] + [(int(q), int(s[0]), CANDIDATE_RESPONSE)]
            for history, qs, ss in zip(histories, cq, cs) for q, s in zip(qs, ss)]
    q, s, r = _left_pad(rows, WINDOW, (PAD_ID, PAD_ID, PAD_RESPONSE))
    with torch.no_grad():
        return torch.sigmoid(model(q, s.unsqueeze(-1), r).logits[:, -1]).reshape(cq.shape)


def _rank(model, history, cq, cs) -> torch.Tensor:
    with torch.no_grad():
        return torch.sigmoid(model.rank(*history, cq, cs))


@pytest.mark.parametrize("name", list(PRESETS))
def test_rank_equals_per_candidate_windows(name):
    histories = _histories()
    history = _history_tensors(histories)
    for fused in (True, False):
        model = _model(name, fused=fused)
        for n in (1, 3, 64):
            cq, cs = _candidates(len(histories), n, seed=n)
            ref = _windows_reference(model, histories, cq, cs)
            assert (_rank(model, history, cq, cs) - ref).abs().max().item() < TOL, (fused, n)
        model.freeze_biases()                                        # the exported form
        assert (_rank(model, history, cq, cs) - _windows_reference(model, histories, cq, cs)).abs().max() < TOL
    flipped = [[(q, s, 1 - r) for q, s, r in h] for h in histories]  # the test can fail: history matters
    moved = _rank(model, _history_tensors(flipped), cq, cs)
    assert (moved - _rank(model, history, cq, cs)).abs().max().item() > 1e-4


@pytest.mark.parametrize("name", ["routerkt-akt", "routerkt-cl4kt-qn"])
def test_rank_equals_windows_with_person_topk(name):
    """The person-level top-K reads the prefix mean, which the rank layout takes over [history, candidate]."""
    histories = _histories()
    history = _history_tensors(histories)
    model = _model(name, person_topk=True)
    for n in (1, 5):
        cq, cs = _candidates(len(histories), n, seed=n)
        assert (_rank(model, history, cq, cs) - _windows_reference(model, histories, cq, cs)).abs().max().item() < TOL


@pytest.mark.parametrize("name", list(PRESETS))
def test_candidates_do_not_see_each_other(name):
    model = _model(name, seed=3)
    history = _history_tensors(_histories(seed=4))
    cq, cs = _candidates(len(HISTORY_LENGTHS), 8, seed=5)
    cq[:, 2], cs[:, 2] = PAD_ID, PAD_ID                               # a padding candidate among them
    keep = torch.tensor([0, 1, 3, 4, 5, 6, 7])
    base = _rank(model, history, cq, cs)[:, keep]
    extra_q, extra_s = _candidates(len(HISTORY_LENGTHS), 24, seed=6)
    added = _rank(model, history, torch.cat([extra_q[:, :11], cq, extra_q[:, 11:]], 1),
                  torch.cat([extra_s[:, :11], cs, extra_s[:, 11:]], 1))[:, 11:19][:, keep]
    removed = _rank(model, history, cq[:, :2], cs[:, :2])
    single = _rank(model, history, cq[:, 5:6], cs[:, 5:6])
    perm = torch.tensor([7, 3, 0, 6, 2, 4, 1, 5])
    reordered = _rank(model, history, cq[:, perm], cs[:, perm])
    back = torch.empty_like(reordered)
    back[:, perm] = reordered
    assert (added - base).abs().max().item() < EXACT
    assert (removed - base[:, :2]).abs().max().item() < EXACT
    assert (single[:, 0] - base[:, 4]).abs().max().item() < EXACT
    assert (back[:, keep] - base).abs().max().item() < EXACT


def test_sequence_scope_has_no_rank():
    cfg = with_vocab(preset_config("routerkt-akt"), NQ, NS)
    cfg.routing_scope = RoutingScope.SEQUENCE
    history = _history_tensors(_histories())
    with pytest.raises(ValueError, match="sequence"):
        build_model(cfg).eval().rank(*history, *_candidates(len(HISTORY_LENGTHS), 2))


def test_signature_names_the_rank_graph():
    rank = signature.GRAPHS["rank"]
    assert rank is signature.RANK and "score" in signature.GRAPHS
    assert rank.input_names == ("history_questions", "history_skills", "history_responses",
                                "candidate_questions", "candidate_skills")
    assert rank.output_names == (signature.CANDIDATE_PROBS,) == ("candidate_probs",)
    assert [t.axes for t in rank.inputs][2:4] == [("batch", "history"), ("batch", "candidates")]
    assert signature.RANK_ONNX_FILE == "rank.onnx" != signature.ONNX_FILE


@pytest.mark.parametrize("name", [n for n in PRESETS if preset_config(n).backbone.value != "dkt"])
def test_rank_runs_the_prediction_mlp_on_candidates_only(name):
    """Serving reads the candidates alone, so the prediction MLP sees [B, N] positions, not H + N."""
    model = _model(name)
    seen: list[tuple[int, ...]] = []
    handle = model.head.register_forward_hook(lambda module, inputs, output: seen.append(tuple(inputs[0].shape)))
    history = _history_tensors(_histories())
    cq, cs = _candidates(len(HISTORY_LENGTHS), 3)
    with torch.no_grad():
        model.rank(*history, cq, cs)
        model(*history)
    handle.remove()
    assert seen == [(len(HISTORY_LENGTHS), 3, model.config.d_model), (len(HISTORY_LENGTHS), WINDOW - 1,
                                                                     model.config.d_model)]


@pytest.mark.parametrize("name", list(PRESETS))
def test_rank_with_skill_sets_equals_per_candidate_windows(name):
    """Multi-skill histories and candidates (sets of 1..3 skills, one K for both)."""
    from export.onnx_export import rank_inputs, rank_reference

    model = _model(name)
    arrays = rank_inputs(NQ, NS, batch=3, history=WINDOW - 1, candidates=5, seed=4, skills=3)
    assert (arrays[1] != PAD_ID).sum(-1).max() == 3                       # some sets have three skills
    got = _rank(model, [torch.from_numpy(a) for a in arrays[:3]], *(torch.from_numpy(a) for a in arrays[3:]))
    valid = (arrays[4] != PAD_ID).any(-1)
    assert (got.numpy() - rank_reference(model, *arrays))[valid].__abs__().max() < 1e-5


@pytest.mark.parametrize("name", [n for n in PRESETS if preset_config(n).backbone.value != "dkt"])
def test_rank_attention_reads_history_and_own_slot_only(name):
    """The rank layout's cost: every attention layer scores H + 1 key columns (the history and the
    query's own slot), not H + N; value encoders read by the PAST retriever only (AKT's knowledge
    encoder, CL4KT's interaction encoder) run on the H history positions alone."""
    from training.models.attention import MultiHeadAttention
    from training.models.outputs import Collector

    model = _model(name, fused=False)
    history = _history_tensors(_histories())
    B, H, N = len(HISTORY_LENGTHS), WINDOW - 1, 7
    cq, cs = _candidates(B, N)
    shapes: dict[str, list[tuple[int, ...]]] = {}
    hooks = [m.register_forward_hook(lambda mod, inputs, out, name=n: shapes.setdefault(name, []).append(
        tuple(inputs[0].shape))) for n, m in model.named_modules() if isinstance(m, MultiHeadAttention)]
    collect = Collector(want_attention=True)
    with torch.no_grad():
        model.compute(*model.rank_layout(*history, cq, cs), collect, read_from=H)
    for h in hooks:
        h.remove()
    value_encoders = ("knowledge_encoder", "interaction_encoder")
    for layer_name, seen in shapes.items():
        positions = H if layer_name.startswith(value_encoders) else H + N
        assert seen == [(B, positions, model.config.d_model)], layer_name
    for layer_name, probs in zip(collect.names, collect.attention):
        keys = H if layer_name.startswith(value_encoders) else H + 1
        assert probs.shape[-1] == keys, layer_name
