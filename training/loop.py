"""Training and evaluation of one fold: Adam, gradient clipping, optional bf16 autocast, early
stopping on validation AUC, best checkpoint written atomically, TensorBoard scalars, per-epoch
history. Scored positions are all real (non-padding) positions of each window."""
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

from training.batching import Batch, iterate
from routerkt.atomic import atomic_write_json
from training.checkpoint import load_checkpoint, save_checkpoint
from training.config import RunConfig
from training.data.protocol import Sequences
from routerkt.contract.vocab import Vocab
from training.metrics import summarize
from training.models.base import KTModel
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


def autocast(bf16: bool):
    """bf16 autocast when asked for (train.bf16) and the CPU supports it; float32 otherwise."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 and bf16_available() else nullcontext()


def batch_loss(model: KTModel, batch: Batch, bf16: bool = False) -> tuple[torch.Tensor, dict[str, float]]:
    with autocast(bf16):
        out = model(batch.questions, batch.skills, batch.responses)
    scored = batch.responses >= 0
    bce = F.binary_cross_entropy_with_logits(out.logits[scored], batch.responses[scored].float())
    parts = {"bce": bce.detach(), **out.aux}
    return bce + out.aux_loss, parts


@torch.inference_mode()
def predict(model: KTModel, seqs: Sequences, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Labels and probabilities of every scored position of `seqs` (float32, as served)."""
    model.eval()
    labels, probs = [], []
    for batch in iterate(seqs, batch_size, shuffle=False):
        logits = model(batch.questions, batch.skills, batch.responses).logits
        scored = batch.responses >= 0
        labels.append(batch.responses[scored].numpy())
        probs.append(torch.sigmoid(logits.float())[scored].numpy())
    if not labels:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(labels), np.concatenate(probs)


def evaluate(model: KTModel, seqs: Sequences, batch_size: int) -> dict[str, float]:
    return summarize(*predict(model, seqs, batch_size))


def train_fold(cfg: RunConfig, vocab: Vocab, data: FoldData, fold_dir: Path, fold: int, run_id: str,
               log: Callable[[str], None] = lambda m: tqdm.write(m, file=sys.stderr),
               progress: bool = True) -> dict:
    tc = cfg.train
    fold_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(tc.seed + fold)
    model = build_model(cfg.model)
    optimizer = torch.optim.Adam(model.parameters(), lr=tc.lr, weight_decay=tc.weight_decay)
    from torch.utils.tensorboard import SummaryWriter  # heavy import, only when training
    writer = SummaryWriter(log_dir=str(fold_dir / "tensorboard"))
    history: list[dict] = []
    best_auc, best_epoch, started = -math.inf, -1, time.perf_counter()
    bar = tqdm(range(tc.epochs), desc=f"fold {fold}", unit="epoch", leave=False, disable=not progress, file=sys.stderr)
    for epoch in bar:
        model.train()
        t0, seen, totals = time.perf_counter(), 0, {}
        for batch in iterate(data.train, tc.batch_size, shuffle=True, buckets=tc.length_buckets,
                             seed=tc.seed * 1000 + fold * 100003 + epoch):
            loss, parts = batch_loss(model, batch, tc.bf16)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if tc.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
            optimizer.step()
            seen += batch.size
            for k, v in parts.items():
                totals[k] = totals.get(k, 0.0) + float(v) * batch.size
        train_seconds = time.perf_counter() - t0
        valid = evaluate(model, data.valid, tc.batch_size)
        row = {"epoch": epoch, "train_seconds": train_seconds, "train_seq_per_s": seen / max(train_seconds, 1e-9),
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
        if epoch - best_epoch > tc.patience:              # the reference code: stop after patience+1 flat epochs
            break
    writer.close()
    best = load_checkpoint(fold_dir)
    test = evaluate(best.model, data.test, tc.batch_size)
    result = {"fold": fold, "best_epoch": best_epoch, "epochs_run": len(history), "valid_auc": best_auc,
              "test": test, "seconds": time.perf_counter() - started,
              "train_seq_per_s": float(np.median([h["train_seq_per_s"] for h in history]))}
    atomic_write_json(fold_dir / "result.json", result)
    return result
