"""Data-parallel training (training/distributed.py, started by training/launch.py) on CPU, gloo
over loopback, 2 processes: the same preset, seed and global batch train like one process (same
validation AUCs and losses per epoch, same early stop, same test AUC within 1e-4); a process killed
mid-run fails the run with one line, leaves no half-written file, and the resumed run keeps the
finished fold and redoes the other.

Dropout is off in the comparison: each rank draws its own dropout masks, which cannot be one
process's. The router's load-balance loss stays on (its statistics are summed over the ranks)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY_OVERRIDES, train_tiny

pytestmark = pytest.mark.integration
ROUTERKT = str(Path(sys.executable).parent / "routerkt")
# lr 3e-2 with patience 0: validation AUC peaks at epoch 1 of 4, so early stopping decides the length
# float32 (train.bf16=false): on a CPU with bf16 kernels (AVX512-BF16) the autocast's rounding makes
# one process and two differ by ~1e-3 AUC after two steps; the comparison is about the sharded
# loss and the all-reduce, not about bf16.
COMPARE = ["model.dropout=0", "train.patience=0", "train.min_steps=0", "train.lr=3e-2", "train.bf16=false"]


def _fold(run: Path, k: int = 0) -> tuple[dict, list[dict]]:
    return (json.loads((run / f"fold-{k}" / "result.json").read_text()),
            json.loads((run / f"fold-{k}" / "history.json").read_text()))


def test_shards_losses_and_gradients_add_up_to_the_global_batch(synthetic_csv):
    """Without processes: the ranks' shard losses (loop.batch_loss with the global token count) and
    their gradients sum to the one-process loss and gradient of the batch (AKT: BCE + Rasch L2)."""
    import torch

    from training.batching import iterate
    from training.distributed import RankInfo, shard
    from training.fold_training import batch_loss
    from training.models.registry import build_model, run_config
    from training.training_run import prepare
    cfg, _, seqs, _ = prepare(run_config("akt-standard", synthetic_csv, [*TINY_OVERRIDES, "model.dropout=0"]))
    torch.manual_seed(0)
    model = build_model(cfg.model).train()
    big = next(iterate(seqs, 37, shuffle=True, seed=1))

    def grads(loss):
        model.zero_grad()
        loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    small = next(iterate(seqs, 3, shuffle=True, seed=2))
    for batch, world in ((big, 2), (big, 3), (small, 5)):      # 5 processes, 3 rows: two stand-in shards
        full, _ = batch_loss(model, batch)
        want = grads(full)
        pieces = [shard(batch, RankInfo(rank=r, world=world)) for r in range(world)]
        assert sum(p.share for p in pieces) == pytest.approx(1.0)
        assert sum(p.batch.size for p in pieces if p.share) == batch.size
        # DDP averages the ranks' gradients of loss * grad_scale: the mean of those, computed here in one process
        losses = [batch_loss(model, p.batch, tokens=p.tokens)[0] * (p.grad_scale / world) for p in pieces]
        assert float(sum(losses).detach()) == pytest.approx(float(full.detach()), rel=1e-5)
        got = sum(grads(loss) for loss in losses)
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-7)
    # plain DDP over per-shard MEANS would not match: the shards hold different numbers of tokens
    pieces = [shard(big, RankInfo(rank=r, world=2)) for r in range(2)]
    naive = sum(batch_loss(model, p.batch)[0].detach() for p in pieces) / 2
    assert abs(float(naive) - float(batch_loss(model, big)[0].detach())) > 1e-4


@pytest.mark.slow
def test_two_processes_train_like_one(synthetic_csv, tmp_path):
    from training import launch as launcher
    from training.config import RunConfig, apply_overrides
    from training.models.registry import preset_config
    one = train_tiny(synthetic_csv, tmp_path / "one", extra=COMPARE, epochs=4)
    cfg = RunConfig(preset="routerkt-akt", model=preset_config("routerkt-akt"))
    cfg.data.path, cfg.data.folds, cfg.train.epochs = str(synthetic_csv), 1, 4     # as train_tiny
    cfg = apply_overrides(cfg, TINY_OVERRIDES + COMPARE)
    metrics = launcher.train(cfg, tmp_path / "two", nproc=2, progress=False)

    (r1, h1), (r2, h2) = _fold(one), _fold(tmp_path / "two")
    assert r1["epochs_run"] == r2["epochs_run"] < 4                 # early stopping, the same epoch
    assert (r1["best_epoch"], r1["steps"]) == (r2["best_epoch"], r2["steps"])
    for a, b in zip(h1, h2):
        assert abs(a["valid_auc"] - b["valid_auc"]) < 1e-4, (a, b)
        assert abs(a["train_bce"] - b["train_bce"]) < 1e-5, (a, b)
        assert abs(a["train_balance"] - b["train_balance"]) < 1e-5, (a, b)
    assert abs(r1["test"]["auc"] - r2["test"]["auc"]) < 1e-4
    assert metrics["auc"]["mean"] == pytest.approx(r2["test"]["auc"])
    # rank 0 alone wrote: the same files as one process, one TensorBoard event file
    files = sorted(p.relative_to(tmp_path / "two").as_posix() for p in (tmp_path / "two").rglob("*") if p.is_file())
    assert [f for f in files if "tensorboard" in f] and len([f for f in files if "tensorboard" in f]) == 1
    assert {f for f in files if "tensorboard" not in f} == {
        p.relative_to(one).as_posix() for p in one.rglob("*") if p.is_file() and "tensorboard" not in p.as_posix()}


@pytest.mark.slow
def test_a_killed_process_fails_the_run_and_the_resume_finishes_it(synthetic_csv, tmp_path):
    from training.checkpoint import load_checkpoint
    run = tmp_path / "run"
    extra = ["data.folds=2"]          # 72 training learners per fold, batch 64: 2 steps per epoch, 4 per fold
    sets = [a for o in TINY_OVERRIDES for a in ("--set", o)]
    # the test hook: rank 1 SIGKILLs itself after its 7th step, in fold 1's second epoch (fold 1 has a checkpoint)
    env = {**os.environ, "ROUTERKT_NO_REEXEC": "1", "ROUTERKT_TEST_DIE_AFTER_STEPS": "1:7"}
    proc = subprocess.run([ROUTERKT, "train", "--data", str(synthetic_csv), "--preset", "routerkt-akt", "--folds", "2",
                           "--epochs", "2", *sets, "--nproc", "2", "--out", str(run), "--no-progress"],
                          check=False, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert errors == ["routerkt train: error: training process 1 died (signal 9, SIGKILL)"], proc.stderr
    assert "Traceback" not in proc.stderr
    assert (run / "fold-0" / "result.json").is_file()                 # fold 0 finished
    assert not (run / "fold-1" / "result.json").exists() and not (run / "metrics.json").exists()
    assert (run / "fold-1" / "meta.json").is_file()                   # an unfinished fold's checkpoint ...
    load_checkpoint(run / "fold-1")                                   # ... is whole (verified), never half-written
    assert not [p for p in run.rglob("*") if p.name.endswith(".tmp")]
    done = (run / "fold-0" / "result.json").stat().st_mtime_ns

    train_tiny(synthetic_csv, run, extra=extra, epochs=2)             # resume, one process
    assert (run / "fold-0" / "result.json").stat().st_mtime_ns == done  # not retrained
    result, history = _fold(run, 1)
    assert result["epochs_run"] == len(history) == 2                  # fold 1 trained again from scratch
    assert len(list((run / "fold-1" / "tensorboard").iterdir())) == 1  # the killed attempt's files are gone
    assert json.loads((run / "metrics.json").read_text())["folds"] == 2
