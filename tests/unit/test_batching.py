"""Tests of training/batching.py and the batching fields of TrainConfig: uniformly shuffled batches by
default (length-sorted only on request), trimming that drops only all-padding columns, old run
records that still load as what they trained with, and min_steps keeping early stopping from ending
a one-step-per-epoch run before it had its steps."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from routerkt.contract.signature import PAD_ID
from training.batching import batch_order, iterate
from training.config import (
    Batching,
    RunConfig,
    TrainConfig,
    apply_overrides,
    from_dict,
    to_dict,
)
from training.data.protocol import Sequences

pytestmark = pytest.mark.unit
W = 20


def _seqs(n=600, seed=0) -> Sequences:
    """Left-padded sequences with lengths spread over 1..W (like a real dataset's long tail); skill sets
    of one or two skills ([n, W, 2], PAD_ID in unused slots and at padding)."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.geometric(0.12, n), W).astype(np.int64)
    q = np.full((n, W), PAD_ID, dtype=np.int64)
    s, r = np.full((n, W, 2), PAD_ID, dtype=np.int64), np.full((n, W), -1, dtype=np.int64)
    for i, k in enumerate(lengths):
        q[i, W - k:] = rng.integers(2, 30, k)
        s[i, W - k:, 0] = rng.integers(2, 10, k)
        s[i, W - k:, 1] = np.where(rng.random(k) < 0.3, rng.integers(10, 20, k), PAD_ID)
        r[i, W - k:] = rng.integers(0, 2, k)
    return Sequences(questions=q, skills=s, responses=r, lengths=lengths, learners=np.arange(n))


def _spread(lengths: np.ndarray, batches: list[np.ndarray]) -> float:
    """Variance across batches of the batches' mean length."""
    return float(np.var([lengths[b].mean() for b in batches]))


def test_default_is_random():
    assert TrainConfig().batching is Batching.RANDOM
    assert TrainConfig().trim_padding is True


def test_default_batches_are_the_plain_uniform_shuffle():
    lengths, bs, seed = _seqs().lengths, 32, 7
    got = batch_order(lengths, bs, True, Batching.RANDOM, np.random.default_rng(seed))
    rng = np.random.default_rng(seed)                       # the plain recipe, written out
    order = rng.permutation(len(lengths))
    plain = [order[i:i + bs] for i in range(0, len(order), bs)]
    plain = [plain[i] for i in rng.permutation(len(plain))]
    assert len(got) == len(plain) and all(np.array_equal(a, b) for a, b in zip(got, plain))
    assert np.array_equal(np.sort(np.concatenate(got)), np.arange(len(lengths)))   # each learner once
    via_iterate = [b.index for b in iterate(_seqs(), bs, shuffle=True, seed=seed)]
    assert all(np.array_equal(a, b) for a, b in zip(via_iterate, plain))


def test_random_batches_mix_lengths_and_bucketed_ones_do_not():
    """Across-batch variance of the mean length: near its sampling expectation for random batches
    (var(length) / B * (N - B) / (N - 1)), far above it (sorted bands) for length-bucketed ones."""
    lengths, bs = _seqs(n=2400).lengths, 16
    expected = lengths.var() / bs * (len(lengths) - bs) / (len(lengths) - 1)
    rng = np.random.default_rng(3)
    random = np.mean([_spread(lengths, batch_order(lengths, bs, True, Batching.RANDOM, rng)) for _ in range(5)])
    bucketed = _spread(lengths, batch_order(lengths, bs, True, Batching.LENGTH_BUCKETED, np.random.default_rng(3)))
    assert 0.7 * expected < random < 1.3 * expected
    assert bucketed > 10 * expected
    for b in batch_order(lengths, bs, True, Batching.LENGTH_BUCKETED, np.random.default_rng(3)):
        assert np.all(np.diff(lengths[b]) <= 0)             # one length band per batch, sorted


def test_trimming_drops_only_all_padding_columns():
    seqs = _seqs(n=200, seed=1)
    for batching in Batching:
        for batch in iterate(seqs, 16, shuffle=True, batching=batching, seed=2):
            idx, width = batch.index, batch.questions.shape[1]
            dropped = slice(0, W - width)
            assert (seqs.skills[idx, dropped] == PAD_ID).all() and (seqs.responses[idx, dropped] == -1).all()
            assert (seqs.skills[idx, W - width] != PAD_ID).any()              # the first kept column is real
            assert np.array_equal(batch.skills.numpy(), seqs.skills[idx, W - width:])
            assert batch.skills.shape == (len(idx), width, 2) and batch.skills.dtype == torch.int64
            assert int((batch.responses >= 0).sum()) == int(seqs.lengths[idx].sum())   # every real token kept
    full = next(iterate(seqs, 16, shuffle=True, trim=False, seed=2))
    assert full.questions.shape[1] == W


def test_loop_batches_as_the_config_says(monkeypatch, tmp_path):
    """train_fold passes train.batching and train.trim_padding to the batch iterator."""
    from training import fold_training as loop
    seen = []
    real = loop.iterate

    def spy(*args, **kwargs):
        if kwargs.get("shuffle"):
            seen.append((kwargs.get("batching"), kwargs.get("trim")))
        return real(*args, **kwargs)
    monkeypatch.setattr(loop, "iterate", spy)
    _train(tmp_path / "a", ["train.epochs=1", "train.min_steps=0"])
    _train(tmp_path / "b", ["train.epochs=1", "train.min_steps=0", "train.batching=length_bucketed",
                            "train.trim_padding=false"])
    assert seen == [(Batching.RANDOM, True), (Batching.LENGTH_BUCKETED, False)]


# ----------------------------------------------------------------------------------------------
# old run records

def _old_train_record(length_buckets) -> dict:
    d = to_dict(TrainConfig())
    for k in ("batching", "trim_padding", "min_steps"):
        d.pop(k)
    d["length_buckets"] = length_buckets
    return d


@pytest.mark.parametrize(("old", "batching"), [(True, Batching.LENGTH_BUCKETED), (False, Batching.RANDOM)])
def test_old_records_load_as_what_they_trained_with(old, batching):
    record = to_dict(RunConfig())
    record["train"] = _old_train_record(old)
    cfg = from_dict(RunConfig, json.loads(json.dumps(record)))
    assert cfg.train.batching is batching and cfg.train.trim_padding is True
    assert cfg.train.min_steps == 0                         # no minimum existed then
    assert from_dict(RunConfig, to_dict(cfg)) == cfg         # and it round-trips in the new form


def test_contradicting_or_renamed_fields_are_refused():
    bad = {**_old_train_record(True), "batching": "random"}
    with pytest.raises(ValueError, match="contradicts"):
        from_dict(TrainConfig, bad)
    with pytest.raises(ValueError, match="renamed"):
        apply_overrides(RunConfig(), ["train.length_buckets=false"])
    with pytest.raises(ValueError, match="random, length_bucketed"):
        apply_overrides(RunConfig(), ["train.batching=sorted"])


# ----------------------------------------------------------------------------------------------
# min_steps

def _train(out, extra):
    """A tiny DKT on 40 synthetic learners: batch 512 holds every training learner, one step per epoch."""
    from training.data.synthetic import generate, write_csv
    from training.models.registry import run_config
    from training.training_run import run_training
    data = out.parent / "tiny.csv"
    if not data.exists():
        write_csv(generate(n_learners=40, seed=5), data)
    cfg = run_config("dkt", data, ["data.folds=1", "data.window=10", "model.d_model=8", "model.lstm_hidden=8",
                                   "model.final_fc=8", "model.final_fc2=8", "train.batch_size=512", *extra])
    run_training(cfg, out, progress=False)
    return json.loads((out / "fold-0" / "result.json").read_text())


def test_min_steps_keeps_a_one_step_per_epoch_run_going(tmp_path):
    # lr 0: the validation AUC never improves after epoch 0, so patience 1 alone stops at epoch 2
    common = ["train.lr=0", "train.patience=1", "train.epochs=60"]
    alone = _train(tmp_path / "alone", [*common, "train.min_steps=0"])
    assert alone["steps"] == alone["epochs_run"] == 3 and alone["best_epoch"] == 0
    held = _train(tmp_path / "held", [*common, "train.min_steps=12"])
    assert held["steps"] == held["epochs_run"] == 12 and held["best_epoch"] == 0
    capped = _train(tmp_path / "capped", ["train.lr=0", "train.patience=1", "train.epochs=5", "train.min_steps=200"])
    assert capped["epochs_run"] == 5                         # train.epochs still bounds the run
