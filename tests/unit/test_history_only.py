"""History-only (prefix) scoring, the leak-free score of a leaking model: each position is scored
from a window that ends at it, with its own response (the label) replaced as the gateway does."""
import numpy as np
import pytest
import torch

from routerkt.contract.signature import CANDIDATE_RESPONSE, PAD_ID
from training.eval.analysis import prefix_predictions, prefix_windows
from training.config import RoutingScope
from training.data.protocol import Sequences
from training.models.registry import build_model, preset_config, with_vocab

pytestmark = pytest.mark.unit
NQ, NS, W = 30, 10, 12


def _seqs(seed=0) -> Sequences:
    rng = np.random.default_rng(seed)
    lengths = np.array([12, 7, 3, 9])
    q = np.full((4, W), PAD_ID, dtype=np.int64)
    s, r = np.full((4, W, 2), PAD_ID, dtype=np.int64), np.full((4, W), -1, dtype=np.int64)   # skill sets of 1-2
    for i, n in enumerate(lengths):
        q[i, W - n:] = rng.integers(2, NQ, n)
        s[i, W - n:, 0] = rng.integers(2, NS, n)
        s[i, W - n:, 1] = np.where(rng.random(n) < 0.4, rng.integers(2, NS, n), PAD_ID)
        r[i, W - n:] = rng.integers(0, 2, n)
    return Sequences(questions=q, skills=s, responses=r, lengths=lengths, learners=np.arange(4))


def test_windows_end_at_the_scored_position_and_hide_its_label():
    seqs = _seqs()
    q, s, r, labels = prefix_windows(seqs)
    assert len(labels) == seqs.n_interactions
    assert (r[:, -1] == CANDIDATE_RESPONSE).all() and (s[:, -1, 0] != PAD_ID).all() and s.shape[2] == 2
    assert ((r == -1) == (s == PAD_ID).all(axis=-1)).all()             # padding: every skill slot PAD_ID
    # learner 1 (7 interactions): its 3rd scored window holds its first 3 interactions
    row = int(seqs.lengths[0]) + 2
    assert list(q[row, -3:]) == list(seqs.questions[1, W - 7:W - 4])
    assert s[row, -3:].tolist() == seqs.skills[1, W - 7:W - 4].tolist()
    assert list(r[row, -3:-1]) == list(seqs.responses[1, W - 7:W - 5])
    assert labels[row] == seqs.responses[1, W - 5]


def test_a_leaking_model_cannot_read_the_label_through_history_only_scoring():
    torch.manual_seed(0)
    cfg = with_vocab(preset_config("routerkt-akt"), NQ, NS)
    cfg.routing_scope = RoutingScope.SEQUENCE                 # routing weights averaged over the whole window
    model = build_model(cfg).eval()
    seqs, flipped = _seqs(), _seqs()
    flipped.responses[:, -1] = 1 - flipped.responses[:, -1]   # each learner's most recent label flipped
    _, before = prefix_predictions(model, seqs)
    _, after = prefix_predictions(model, flipped)
    assert np.abs(before - after).max() < 1e-6
    # control: scored on the whole window, the same model reads the label at its last position
    with torch.no_grad():
        whole = [torch.sigmoid(model(*(torch.from_numpy(a) for a in (x.questions, x.skills, x.responses))).logits)
                 for x in (seqs, flipped)]
    assert (whole[0][:, -1] - whole[1][:, -1]).abs().max().item() > 1e-4
