"""The served protocol (training/eval/served_protocol.py) predicts each answer as the server does: checked answer by
answer against the model's rank forward on what the server holds (window: the last W - 1 before the answer;
band: the whole history before it), on learners shorter than, as long as and longer than the window."""
import numpy as np
import pytest
import torch

from tests.tiny_models import random_tiny_model
from training.config import Context
from training.data.protocol import Sequences
from training.eval.served_protocol import band_served, log_loss, served, window_served

pytestmark = pytest.mark.unit
NQ, NS, W = 30, 10, 8


def _whole(lengths: list[int], seed: int = 0) -> Sequences:
    rng = np.random.default_rng(seed)
    width = max(lengths)
    q = np.zeros((len(lengths), width), np.int64)
    s = np.zeros((len(lengths), width, 1), np.int64)
    r = np.full((len(lengths), width), -1, np.int64)
    for i, n in enumerate(lengths):
        q[i, width - n:] = rng.integers(2, NQ, n)
        s[i, width - n:, 0] = rng.integers(2, NS, n)
        r[i, width - n:] = rng.integers(0, 2, n)
    return Sequences(q, s, r, np.array(lengths, np.int64), np.arange(len(lengths), dtype=np.int64))


def _expected(model, whole: Sequences, keep: int | None) -> dict[tuple[int, int], float]:
    """(learner, t) -> P(correct) of answer t from the `keep` answers before it (None: all of them)."""
    out = {}
    width = whole.questions.shape[1]
    with torch.no_grad():
        for i, n in enumerate(whole.lengths):
            start = width - n
            for t in range(n):
                first = start if keep is None else max(start, start + t - keep)
                cols = slice(first, start + t)
                h = [torch.from_numpy(a[i:i + 1, cols]) for a in (whole.questions, whole.skills, whole.responses)]
                c = [torch.from_numpy(a[i:i + 1, start + t:start + t + 1]) for a in (whole.questions, whole.skills)]
                out[(i, t)] = float(torch.sigmoid(model.rank(*h, *c))[0, 0])
    return out


def _check(labels, probs, index, whole, expected) -> None:
    assert len(probs) == int(whole.lengths.sum())
    got = sorted(zip(index.tolist(), probs.tolist(), labels.tolist()))
    want = sorted((t, p) for (_, t), p in expected.items())
    assert max(abs(g[1] - w[1]) for g, w in zip(got, want)) <= 1e-5


@pytest.mark.parametrize("context", [Context.WINDOW, Context.BAND])
def test_every_answer_is_predicted_from_what_the_server_holds(context) -> None:
    model = random_tiny_model("routerkt-akt", NQ, NS, W, context=context)
    whole = _whole([3, W, W + 1, 3 * W + 2])
    if context is Context.BAND:
        labels, probs, index = band_served(model, whole, batch_size=2)
        expected = _expected(model, whole, None)
    else:
        labels, probs, index = window_served(model, whole, W, batch_size=3)
        expected = _expected(model, whole, W - 1)
    _check(labels, probs, index, whole, expected)
    assert np.array_equal(np.sort(labels), np.sort(whole.responses[whole.responses >= 0]))
    scores = served(model, whole)
    assert scores["all"]["n"] == int(whole.lengths.sum())
    assert scores["slid"]["n"] == sum(max(n - W, 0) for n in whole.lengths)


def test_log_loss() -> None:
    assert log_loss(np.array([1, 0]), np.array([0.5, 0.5])) == pytest.approx(np.log(2))
