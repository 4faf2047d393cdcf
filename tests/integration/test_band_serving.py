"""A band model through the real gateway in-process (onnxruntime backend, real SQLite store; the tiny RouterKT
with band 20 trained on whole histories, exported as a plain `routerkt export` does): a learner's Predict by
learner_id at any history length (here up to 3x the band) equals the PyTorch model over the whole history and
the same history sent explicitly (a stateless Predict through the step graphs), within 1e-5; once built, its
state is never stale when answers are added (Observe's fill appends them, the next Predict is a hit), and the
cache entry's size does not grow with the history."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from routerkt.contract.repository_reader import latest_version, read_vocab
from serving.api import knowledge_tracing_pb2 as pb
from tests.integration.test_learner_states import FILLS, RESULTS, Learner, Served

pytestmark = pytest.mark.integration
BAND = 20


def reference(run, vocab, history, candidates) -> np.ndarray:
    """P(correct) of each candidate after the whole history, from the PyTorch checkpoint (model ids)."""
    from training.checkpoint import load_checkpoint
    from training.training_run import best_fold_dir
    model = load_checkpoint(best_fold_dir(run)).model.eval()
    q = torch.tensor([[vocab.questions[h[0]] for h in history]])
    width = max(len(h[1]) for h in history + candidates)
    s = torch.tensor([[[vocab.skills[k] for k in h[1]] + [0] * (width - len(h[1])) for h in history]])
    r = torch.tensor([[h[2] for h in history]])
    cq = torch.tensor([[vocab.questions[c[0]] for c in candidates]])
    cs = torch.tensor([[[vocab.skills[k] for k in c[1]] + [0] * (width - len(c[1])) for c in candidates]])
    with torch.no_grad():
        return torch.sigmoid(model.rank(q, s, r, cq, cs))[0].numpy()


def test_a_band_model_answers_from_its_rolling_state_at_any_length(kt_band_repository, tmp_path) -> None:
    served = Served(kt_band_repository.path, tmp_path / "sessions.sqlite3")
    try:
        walk_past_the_band(served, kt_band_repository)
    finally:
        served.close()


def walk_past_the_band(served: Served, repo) -> None:
    """One learner observed to 3x the band and on: every Predict by learner_id equal to PyTorch and to the
    history sent (<= 1e-5), a hit after each fill (a miss only first and after more than 4 answers at once),
    the cached bytes the same at every length."""
    vocab = read_vocab(repo.path, "kt", latest_version(repo.path, "kt"))
    questions = [q for q, skills in sorted(vocab.question_skills.items()) if all(s in vocab.skills for s in skills)]
    learner = Learner(served, "band-learner", questions, sorted(vocab.skills), seed=4)
    expected, fills = dict.fromkeys(RESULTS, 0), dict.fromkeys(FILLS, 0)
    gaps, truth, sizes = [], [], []
    for step, observed in enumerate((2 * BAND + 5, 0, 1, 3, BAND, 1)):
        if observed:
            learner.observe(observed)
        if step >= 2:
            fills["filled"] += 1 if observed <= 4 else 0
            fills["dropped"] += 1 if observed > 4 else 0     # more than max_appends at once: rebuilt
        served.await_fills(fills)
        candidates = [(int(q), [int(s)]) for q, s in zip(learner.rng.choice(questions, 3),
                                                          learner.rng.choice(sorted(vocab.skills), 3))]
        stub = served.stub
        request = [pb.Candidate(question_id=q, skill_ids=s) for q, s in candidates]
        by_id = stub.Predict(pb.PredictRequest(model="kt", learner_id=learner.name, candidates=request), timeout=10.0)
        explicit = stub.Predict(pb.PredictRequest(model="kt", candidates=request, history=[
            pb.Interaction(question_id=q, skill_ids=s, correct=c) for q, s, c in learner.history]), timeout=10.0)
        assert by_id.history_used == explicit.history_used == len(learner.history)
        got = np.asarray(by_id.probabilities)
        gaps.append(float(np.abs(got - np.asarray(explicit.probabilities)).max()))
        truth.append(float(np.abs(got - reference(repo.run, vocab, learner.history, candidates)).max()))
        expected["miss" if step == 0 or observed > 4 else "hit"] += 1     # > 4 at once: the fill dropped it
        assert served.lookups() == expected, step
        sizes.append(served.cached()[1])
    assert max(gaps) <= 1e-5, gaps
    assert max(truth) <= 1e-5, truth
    assert len(learner.history) > 3 * BAND and len(set(sizes)) == 1, sizes   # the entry's bytes are fixed
