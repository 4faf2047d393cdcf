"""Training and evaluation of one fold: Adam, gradient clipping, optional bf16 autocast (CPU), early
stopping on validation AUC, best checkpoint written atomically, TensorBoard scalars, per-epoch
history. Scored positions are all real (non-padding) positions of each window. The model lives on
train.device (training/device.py); batches follow it, predictions come back to the CPU."""
from __future__ import annotations

import functools

import math
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from training import device as devices
from training import distributed
from training.batching import Batch, iterate
from routerkt.atomic import atomic_write_json
from training.checkpoint import load_checkpoint, save_checkpoint
from training.config import Batching, RunConfig
from training.data.protocol import Sequences
from routerkt.contract.vocab import Vocab
from training.metrics import summarize
from training.models.kt_model import KTModel
from training.models.registry import build_model


@dataclass
class FoldData:
    train: Sequences
    valid: Sequences
    test: Sequences


@functools.cache
def bf16_available() -> bool:
    """Whether this CPU has oneDNN bf16 kernels (AVX512-BF16 / AMX). Without them bf16 autocast is
    slow emulation at best, and DKT's LSTM fails ("could not create a primitive descriptor")."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def bf16_used(bf16: bool, device: torch.device = torch.device("cpu")) -> bool:
    """Whether training steps run under bf16 autocast: asked for (train.bf16), on the CPU, and the
    CPU has bf16 kernels; float32 otherwise (on CUDA too: training/device.py)."""
    return bf16 and device.type == "cpu" and bf16_available()


def autocast(bf16: bool, device: torch.device = torch.device("cpu")):
    """bf16 autocast where bf16_used says so, else a no-op context."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if bf16_used(bf16, device) else nullcontext()


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def batch_loss(model: KTModel, batch: Batch, bf16: bool = False,
               tokens: int | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean BCE over the batch's scored positions plus the model's auxiliary terms. With `tokens`,
    `batch` is one rank's shard of a global batch holding `tokens` scored positions (training/distributed.py):
    the BCE is SUMMED and divided by that global count, the auxiliary terms (means over this shard's
    positions) are weighed by the shard's share of them, so the ranks' losses add up to the global
    batch's loss. `parts` stay this batch's own means (for logging). `batch` moves to the model's device."""
    batch = batch.to(model_device(model))
    with autocast(bf16, batch.questions.device):
        out = model(batch.questions, batch.skills, batch.responses)
    scored = batch.responses >= 0
    if tokens is None:
        bce = F.binary_cross_entropy_with_logits(out.logits[scored], batch.responses[scored].float())
        loss = bce + out.aux_loss
    else:
        total = F.binary_cross_entropy_with_logits(out.logits[scored], batch.responses[scored].float(), reduction="sum")
        mine = scored.sum()
        bce = total / mine.clamp(min=1)
        loss = (total + out.aux_loss * mine) / tokens
    parts = {"bce": bce.detach(), **out.aux}
    return loss, parts


@torch.inference_mode()
def predict(model: KTModel, seqs: Sequences, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Labels and probabilities of every scored position of `seqs` (float32, as served)."""
    model.eval()
    device = model_device(model)
    labels, probs = [], []
    # evaluation only: length-sorted batches change no prediction (no gradient, scores are per position)
    for batch in iterate(seqs, batch_size, shuffle=False, batching=Batching.LENGTH_BUCKETED):
        moved = batch.to(device)
        logits = model(moved.questions, moved.skills, moved.responses).logits.float().cpu()
        scored = batch.responses >= 0
        labels.append(batch.responses[scored].numpy())
        probs.append(torch.sigmoid(logits)[scored].numpy())
    if not labels:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(labels), np.concatenate(probs)


def evaluate(model: KTModel, seqs: Sequences, batch_size: int) -> dict[str, float]:
    return summarize(*predict(model, seqs, batch_size))


def train_fold(cfg: RunConfig, vocab: Vocab, data: FoldData, fold_dir: Path, fold: int, run_id: str,
               log: Callable[[str], None] = lambda m: tqdm.write(m, file=sys.stderr),
               progress: bool = True, init_state: dict | None = None) -> dict | None:
    """`init_state`: the model's initial weights (a warm start) instead of fresh ones."""
    train_cfg = cfg.train
    rank = distributed.current()      # data-parallel: rank 0 validates, records and decides; the others train
    device = devices.resolve(train_cfg.device, rank.local_rank)
    torch.manual_seed(train_cfg.seed + fold)
    model = build_model(cfg.model)   # built on the CPU (same initial weights everywhere), then moved
    if init_state is not None:
        model.load_state_dict(init_state)
    model = model.to(device)
    distributed.seed_rank(train_cfg.seed + fold)
    net = distributed.wrap(model)     # DDP in a data-parallel run; evaluate and save `model`
    optimizer = torch.optim.Adam(model.parameters(), lr=train_cfg.lr, weight_decay=train_cfg.weight_decay)
    if not rank.is_main:
        return _follow(cfg, data, net, optimizer, fold)
    fold_dir.mkdir(parents=True, exist_ok=True)
    from torch.utils.tensorboard import SummaryWriter  # heavy import, only when training
    writer = SummaryWriter(log_dir=str(fold_dir / "tensorboard"))
    history: list[dict] = []
    best_auc, best_epoch, started, steps = -math.inf, -1, time.perf_counter(), 0
    bar = tqdm(range(train_cfg.epochs), desc=f"fold {fold}", unit="epoch", leave=False, disable=not progress,
               file=sys.stderr)
    for epoch in bar:
        epoch_started = time.perf_counter()
        taken, seen, totals = _train_epoch(cfg, data, net, optimizer, fold, epoch)
        steps += taken
        train_seconds = time.perf_counter() - epoch_started
        valid = evaluate(model, data.valid, train_cfg.batch_size)
        row = {"epoch": epoch, "steps": steps, "train_seconds": train_seconds,
               "train_seq_per_s": seen / max(train_seconds, 1e-9),
               **{f"train_{k}": v / max(seen, 1) for k, v in totals.items()},
               **{f"valid_{k}": v for k, v in valid.items()}}
        history.append(row)
        for k, v in row.items():
            if k != "epoch" and isinstance(v, float) and math.isfinite(v):
                writer.add_scalar(k.replace("_", "/", 1), v, epoch)
        valid_auc = valid["auc"] if math.isfinite(valid["auc"]) else -1.0
        improved = valid_auc > best_auc
        if improved:
            best_auc, best_epoch = valid_auc, epoch
            save_checkpoint(fold_dir, model, cfg, vocab, run_id=run_id, fold=fold, epoch=epoch, valid_auc=valid_auc)
        atomic_write_json(fold_dir / "history.json", history)
        bar.set_postfix(valid_auc=f"{valid['auc']:.4f}", best=f"{best_auc:.4f}")
        log(f"fold {fold} epoch {epoch}: loss {row.get('train_bce', float('nan')):.4f} valid auc {valid['auc']:.4f} "
            f"acc {valid['acc']:.4f} ({row['train_seq_per_s']:.0f} seq/s){' *' if improved else ''}")
        # the reference code: stop after patience+1 flat epochs; here only once min_steps steps were taken
        if distributed.broadcast_flag(epoch - best_epoch > train_cfg.patience and steps >= train_cfg.min_steps):
            break
    writer.close()
    best = load_checkpoint(fold_dir)                 # onto the CPU
    test = evaluate(best.model.to(device), data.test, train_cfg.batch_size)
    result = {"fold": fold, "best_epoch": best_epoch, "epochs_run": len(history), "steps": steps, "valid_auc": best_auc,
              "test": test, "seconds": time.perf_counter() - started,
              "train_seq_per_s": float(np.median([h["train_seq_per_s"] for h in history])),
              "bf16_autocast": bf16_used(train_cfg.bf16, device)}    # hardware-dependent: recorded per fold
    atomic_write_json(fold_dir / "result.json", result)
    return result


def _train_epoch(cfg: RunConfig, data: FoldData, net: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 fold: int, epoch: int) -> tuple[int, int, dict[str, float]]:
    """One epoch of optimizer steps; returns the steps, the sequences seen and the loss parts summed over them.
    Every rank draws the same global batches and trains on its shard (distributed.shard)."""
    train_cfg = cfg.train
    net.train()
    steps, seen, totals = 0, 0, {}
    for batch in iterate(data.train, train_cfg.batch_size, shuffle=True, batching=train_cfg.batching,
                         trim=train_cfg.trim_padding, seed=train_cfg.seed * 1000 + fold * 100003 + epoch):
        piece = distributed.shard(batch)             # the batch itself for one process
        loss, parts = batch_loss(net, piece.batch, train_cfg.bf16, tokens=piece.tokens)
        optimizer.zero_grad(set_to_none=True)
        (loss * piece.grad_scale).backward()          # DDP all-reduces (averages) the gradients here
        if train_cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(net.parameters(), train_cfg.grad_clip)
        optimizer.step()
        distributed.step_hook()
        steps += 1
        seen += piece.rows
        for k, v in parts.items():                    # per-sequence mean over the global batch, summed over ranks
            totals[k] = totals.get(k, 0.0) + float(v) * piece.rows * piece.share
    return steps, seen, distributed.sum_over_ranks(totals)


def _follow(cfg: RunConfig, data: FoldData, net: torch.nn.Module, optimizer: torch.optim.Optimizer, fold: int) -> None:
    """A rank other than 0: train each epoch with rank 0 until it broadcasts its stop decision."""
    for epoch in range(cfg.train.epochs):
        _train_epoch(cfg, data, net, optimizer, fold, epoch)
        if distributed.broadcast_flag(False):
            break
