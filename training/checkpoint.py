"""Checkpoints: model.pt + meta.json per fold, written atomically, and the rebuild of a model from
meta.json alone (config, vocabulary, provenance). meta.json records the SHA-256 of model.pt, so a
checkpoint whose two files do not belong together (or a truncated model.pt) is refused."""
from __future__ import annotations

import hashlib
import io
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from routerkt.atomic import atomic_write_bytes, atomic_write_json
from routerkt.build import git_sha
from routerkt.errors import UserError
from training.config import RunConfig, from_dict, to_dict
from routerkt.contract.vocab import Vocab
from training.models.kt_model import KTModel
from training.models.registry import build_model

FORMAT = "routerkt-checkpoint/1"
WEIGHTS = "model.pt"
META = "meta.json"


@dataclass
class Checkpoint:
    model: KTModel
    config: RunConfig
    vocab: Vocab
    meta: dict


def save_checkpoint(directory: Path, model: KTModel, config: RunConfig, vocab: Vocab, **info) -> None:
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    weights = buf.getvalue()
    meta = {"format": FORMAT, "config": to_dict(config), "vocab": vocab.to_json(),
            "weights_sha256": hashlib.sha256(weights).hexdigest(), "git_sha": git_sha(),
            "torch": torch.__version__, "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **info}
    atomic_write_bytes(Path(directory) / WEIGHTS, weights)
    atomic_write_json(Path(directory) / META, meta)


def load_checkpoint(directory: Path) -> Checkpoint:
    directory = Path(directory)
    meta_path, weights_path = directory / META, directory / WEIGHTS
    if not meta_path.is_file():
        raise UserError(f"{directory}: no {META} (not a training checkpoint)")
    try:
        meta = json.loads(meta_path.read_text())
        if meta.get("format") != FORMAT:
            raise ValueError(f"unsupported format {meta.get('format')!r}")
        config = from_dict(RunConfig, meta["config"])
        vocab = Vocab.from_json(meta["vocab"])
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{meta_path}: corrupt checkpoint metadata ({exc})") from None
    if not weights_path.is_file():
        raise UserError(f"{directory}: {WEIGHTS} is missing")
    weights = weights_path.read_bytes()
    if hashlib.sha256(weights).hexdigest() != meta.get("weights_sha256"):
        raise UserError(f"{weights_path}: does not match {META} (corrupt or half-written checkpoint)")
    model = build_model(config.model)
    try:
        model.load_state_dict(torch.load(io.BytesIO(weights), map_location="cpu", weights_only=True))
    except (RuntimeError, ValueError, EOFError) as exc:
        raise UserError(f"{weights_path}: cannot load weights ({str(exc).splitlines()[0]})") from None
    return Checkpoint(model=model.eval(), config=config, vocab=vocab, meta=meta)
