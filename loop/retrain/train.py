"""The retrain's training step: the base version's configuration (or a preset) on the training rows.

It trains with the grown vocabulary, from scratch or warm (loop/retrain/warm.py)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from routerkt.atomic import atomic_write_json
from routerkt.contract.model_info import ModelInfo
from routerkt.contract.vocab import Vocab
from routerkt.errors import UserError

EPOCHS = 20                # few epochs: a retrain runs on a schedule; early stopping usually ends it sooner
PATIENCE = 3
VALID_SHARE = 0.1          # training learners kept for early stopping
RETRAIN_DEFAULTS = ["data.folds=1", f"train.patience={PATIENCE}"]


@dataclass
class Trained:
    run: Path                # the run folder (config.json, vocab.json, fold-0/) export reads
    vocab: Vocab
    vocab_growth: dict[str, int]
    warm: dict | None        # what the warm start copied (None: from scratch)
    result: dict             # train_fold's result (best epoch, valid AUC, ...)
    window: int              # the model's window (scoring windows)


def build_config(info: ModelInfo, base_fold: Path | None, preset: str | None, train_csv: Path, epochs: int,
                 overrides: list[str]):
    """The base run's whole configuration (`info`: the base version's, loop/retrain/base_version.py) when its run
    is known and no other --preset is asked for, else the preset's (default: the base version's); the
    retrain defaults, then --set, on top."""
    from training.config import Protocol, RunConfig, apply_overrides, from_dict
    from training.models.registry import run_config, trained_as_served
    preset = preset or info.preset
    if not preset:
        raise UserError("the base version names no preset (model_info.json); give --preset")
    if base_fold is not None and preset == info.preset:
        cfg = from_dict(RunConfig, json.loads((base_fold / "meta.json").read_text())["config"])
        cfg.data.path, cfg.data.folds_file, cfg.data.run_folds, cfg.data.dataset = str(train_csv), "", 0, ""
    else:
        try:
            cfg = run_config(preset, train_csv)
        except ValueError as exc:
            raise UserError(f"--preset {preset}: {exc}") from None
    try:
        cfg = apply_overrides(cfg, RETRAIN_DEFAULTS + [f"data.window={info.window}", f"train.epochs={epochs}"]
                              + list(overrides))
    except ValueError as exc:
        raise UserError(str(exc)) from None
    # a window model retrains on every window of the training rows (chunks), a band model on whole histories
    return trained_as_served(cfg, overrides, window=Protocol.CHUNKS)


def train(cfg, base_vocab: Vocab, out: Path, warm_fold: Path | None, log) -> Trained:
    """Train one model on `cfg.data.path` into `out` (a run folder export_run reads), its vocabulary
    `base_vocab` grown by the data's new ids (counted against `base_vocab`)."""
    import torch
    from loop.retrain.data import grown_vocab
    from loop.retrain.warm import warm_start
    from training import device as devices
    from training.data.pipeline import load_interactions, load_run_data
    from training.data.protocol import make_folds
    from training.fold_training import FoldData, train_fold
    from training.models.registry import build_model, with_vocab

    devices.resolve(cfg.train.device)                      # an unusable train.device fails before any work
    if cfg.train.threads > 0:
        torch.set_num_threads(cfg.train.threads)
    vocab, growth = grown_vocab(base_vocab, Vocab.build(load_interactions(cfg.data)))
    data = load_run_data(cfg.data, vocab=vocab)
    cfg.model = with_vocab(cfg.model, vocab.n_questions, vocab.n_skills)
    cfg.model.max_len = cfg.data.window
    learners = np.unique(data.sequences.learners)
    fold = make_folds(learners, 2, VALID_SHARE, cfg.data.seed)[0]          # valid: VALID_SHARE of the learners
    train_ids = np.sort(np.concatenate([fold.train, fold.test]))
    fold_data = FoldData(train=data.sequences.select_learners(train_ids),
                         valid=data.sequences.select_learners(fold.valid),
                         test=data.sequences.select_learners(fold.valid))
    out.mkdir(parents=True, exist_ok=True)
    from training.config import to_dict
    atomic_write_json(out / "config.json", to_dict(cfg))
    vocab.save(out / "vocab.json")
    warm = None
    init_state = None
    if warm_fold is not None:
        torch.manual_seed(cfg.train.seed)
        started = warm_start(warm_fold, build_model(cfg.model), vocab)
        init_state = started.state
        warm = {"from": warm_fold.parent.name, "copied": started.copied, "row_mapped": started.row_mapped,
                "fresh": started.fresh}
    log(f"training {cfg.preset}: {len(fold_data.train)} sequences, {vocab.n_questions - 2} questions "
        f"({growth['new_questions']} new), {vocab.n_skills - 2} skills ({growth['new_skills']} new), "
        f"{'warm start from ' + warm['from'] if warm else 'from scratch'}")
    result = train_fold(cfg, vocab, fold_data, out / "fold-0", 0, f"{out.name}-{cfg.preset}", log=log,
                        progress=False, init_state=init_state)
    return Trained(run=out, vocab=vocab, vocab_growth=growth, warm=warm, result=result or {}, window=cfg.data.window)
