"""The version a retrain builds on: the one its gate compares with, its warm start's and vocabulary's source."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from routerkt.contract.model_info import ModelInfo
from routerkt.contract.repository_reader import read_model_info, read_vocab
from routerkt.contract.vocab import Vocab


@dataclass(frozen=True)
class Base:
    """The version the new model must beat on the held-out events. The new model is trained with its
    configuration and window, warm-started from the run it was exported from, and its vocabulary is this
    version's plus the ids the platform added since (the report counts those against it)."""

    version: int
    info: ModelInfo
    vocab: Vocab


def choose_base(repository: Path, model: str, compared: dict[str, dict[str, float]]) -> Base:
    """Of the versions scored on the held-out events (`compared`: version -> metrics, the served version
    first), the one with the lowest log loss: the served version alone, or, replacing an undecided canary,
    the better of its two (a tie keeps the served version)."""
    version = int(min(compared, key=lambda v: compared[v]["log_loss"]))
    return Base(version, read_model_info(repository, model, version), read_vocab(repository, model, version))
