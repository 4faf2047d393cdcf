"""One training run end to end: read the data, build the vocabulary and the folds, train each fold
(resumable: folds with a result.json are skipped; a fold folder without one is unfinished, removed
and trained again), and write DIR/metrics.json. In a data-parallel run (training/distributed.py)
every rank reads the data and trains; only rank 0 writes, and its view of which folds are done
decides.

Run directory layout:
    DIR/config.json            the RunConfig (preset + overrides; data.path portable,
                               training/data/pipeline.py)
    DIR/vocab.json             the id vocabulary (also inside every meta.json)
    DIR/folds.json             the learner ids of each fold (train / valid / test)
    DIR/fold-K/{model.pt, meta.json, history.json, result.json, tensorboard/}
    DIR/metrics.json           {"auc": {"mean", "std", "folds"}, "acc": ..., "rmse": ..., ...}
    DIR/plots/training_curves.{png,json}
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from routerkt.errors import UserError
from routerkt.atomic import atomic_write_json
from training import device as devices
from training import distributed
from training.checkpoint import git_sha
from training.config import Context, Protocol, RunConfig, from_dict, to_dict
from training.data.pipeline import load_run_data, portable_data
from training.data.protocol import Fold
from training.fold_training import FoldData, train_fold
from training.metrics import aggregate
from training.models.registry import with_vocab


def prepare(cfg: RunConfig, log=None):
    """Read and window the data; returns (config with vocabulary sizes, vocab, sequences, folds).
    `log` gets one line saying how the file's rows were read (merged multi-skill rows)."""
    check_protocol(cfg)
    data = load_run_data(cfg.data)
    if log is not None:
        log(data.note)
    cfg.model = with_vocab(cfg.model, data.vocab.n_questions, data.vocab.n_skills)
    cfg.model.max_len = cfg.data.window
    return cfg, data.vocab, data.sequences, data.folds


def check_protocol(cfg: RunConfig) -> None:
    """A band model trains on whole histories (the function it serves); a window model on windows."""
    band = cfg.model.context is Context.BAND
    if band != (cfg.data.protocol is Protocol.WHOLE):
        need = "data.protocol=whole" if band else "data.protocol=recent or chunks"
        raise UserError(f"model.context={cfg.model.context.value} trains with {need}, not "
                        f"data.protocol={cfg.data.protocol.value}")


def _check_resume(out: Path, cfg: RunConfig) -> None:
    saved = out / "config.json"
    if not saved.exists():
        return
    try:
        previous = from_dict(RunConfig, json.loads(saved.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{saved}: unreadable run config ({exc})") from None
    previous.data = portable_data(previous.data)      # runs recorded before paths were portable
    a, b = to_dict(previous), to_dict(cfg)
    for d in (a, b):                     # may change between invocations of the same run
        d["train"].pop("epochs"), d["train"].pop("threads"), d["train"].pop("device"), d["data"].pop("run_folds")
    if a != b:
        raise UserError(f"{out} holds a run with a different configuration; choose another --out")


def run_training(cfg: RunConfig, out: Path, progress: bool = True) -> dict:
    """Train every fold of `cfg` into `out`; returns the metrics ({} on ranks other than 0)."""
    out = Path(out)
    rank = distributed.current()
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file")
    devices.resolve(cfg.train.device, rank.local_rank)   # an unusable train.device fails before any work
    if cfg.train.threads > 0:
        torch.set_num_threads(cfg.train.threads)
    cfg.data = portable_data(cfg.data)                # no absolute path of this machine in the records
    log = (lambda m: tqdm.write(m, file=sys.stderr)) if rank.is_main else (lambda m: None)  # noqa: E731
    cfg, vocab, seqs, folds = prepare(cfg, log)
    _check_resume(out, cfg)
    if rank.is_main:
        _write_run_files(out, cfg, vocab, folds)
    run_id = f"{out.name}-{cfg.preset or 'custom'}"
    progress = progress and rank.is_main
    log(f"{cfg.preset}: {len(seqs)} sequences of {len(np.unique(seqs.learners))} learners, "
        f"{vocab.n_questions} question ids, {vocab.n_skills} skill ids, {len(folds)} fold(s) -> {out}")
    results, started = [], time.perf_counter()
    if cfg.data.run_folds:
        folds = folds[: cfg.data.run_folds]
    for fold in tqdm(folds, desc="folds", unit="fold", disable=not progress, file=sys.stderr):
        result = _run_fold(cfg, vocab, seqs, fold, out, run_id, log, progress)
        if rank.is_main:
            results.append(result)
    if not rank.is_main:
        return {}
    metrics = _write_metrics(out, cfg, results, run_id, time.perf_counter() - started)
    try:
        from training.plots import training_curves
        training_curves(out)
    except ImportError:
        pass
    return metrics


def _write_run_files(out: Path, cfg: RunConfig, vocab, folds: list[Fold]) -> None:
    """config.json, vocab.json and folds.json of the run (rank 0)."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "config.json", to_dict(cfg))
    vocab.save(out / "vocab.json")
    atomic_write_json(out / "folds.json", [
        {"fold": f.index, "train": f.train.tolist(), "valid": f.valid.tolist(), "test": f.test.tolist()}
        for f in folds])


def _run_fold(cfg: RunConfig, vocab, seqs, fold: Fold, out: Path, run_id: str, log, progress: bool) -> dict | None:
    """One fold: its result.json when done already (skipped), else trained (an unfinished fold folder is
    removed first); every rank trains, and only rank 0 gets the result (None elsewhere)."""
    rank = distributed.current()
    fold_dir = out / f"fold-{fold.index}"
    done = fold_dir / "result.json"
    if distributed.broadcast_flag(done.exists()):
        if not rank.is_main:
            return None
        result = json.loads(done.read_text())
        log(f"fold {fold.index}: already done (test auc {result['test']['auc']:.4f}), skipped")
        return result
    if rank.is_main and fold_dir.exists():          # an interrupted fold: its files are complete, the fold is not
        shutil.rmtree(fold_dir)
        log(f"fold {fold.index}: unfinished (no result.json), trained again from scratch")
    data = FoldData(train=seqs.select_learners(fold.train), valid=seqs.select_learners(fold.valid),
                    test=seqs.select_learners(fold.test))
    result = train_fold(cfg, vocab, data, fold_dir, fold.index, run_id, log=log, progress=progress)
    if not rank.is_main:
        return None
    log(f"fold {fold.index}: test auc {result['test']['auc']:.4f} acc {result['test']['acc']:.4f} "
        f"rmse {result['test']['rmse']:.4f}")
    return result


def _write_metrics(out: Path, cfg: RunConfig, results: list[dict], run_id: str, seconds: float) -> dict:
    """DIR/metrics.json: the test metrics over the folds that ran, and how the run went."""
    metrics = aggregate([r["test"] for r in results])
    metrics.update({"preset": cfg.preset, "dataset": cfg.data.dataset, "folds": len(results),
                    "best_epochs": [r["best_epoch"] for r in results],
                    "valid_auc": [r["valid_auc"] for r in results],
                    "train_seq_per_s": float(np.median([r["train_seq_per_s"] for r in results])),
                    "fold_seconds": [round(r["seconds"], 1) for r in results],
                    "wall_seconds_this_invocation": round(seconds, 1),
                    "git_sha": git_sha(), "run_id": run_id})
    atomic_write_json(out / "metrics.json", metrics)
    return metrics


def best_fold_dir(run: Path) -> Path:
    """The fold checkpoint with the highest validation AUC (what export serves by default)."""
    run = Path(run)
    folds = sorted(p for p in run.glob("fold-*") if (p / "meta.json").exists())
    if not folds:
        raise UserError(f"{run}: no fold checkpoint (fold-*/meta.json); is this a training run?")

    def score(p: Path) -> float:
        try:
            return float(json.loads((p / "meta.json").read_text()).get("valid_auc", -1.0))
        except (ValueError, OSError):
            return -1.0
    return max(folds, key=score)


__all__ = ["run_training", "prepare", "best_fold_dir", "Fold"]
