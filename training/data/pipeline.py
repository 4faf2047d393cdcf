"""The one data pipeline of a run, driven by its `DataConfig`: canonical CSV -> rows of multi-skill
interactions merged (data.skill_rows, training/data/skill_rows.py) -> vocabulary -> windowed
sequences -> folds. Training, evaluation, the history-only scorer,
the diversity analysis, the training benchmark and export's parity batches all read data here, so
they all see the windows training saw.

Dataset paths in run records are portable: `portable_data` stores the path relative to the data
root (../shared/datasets next to this checkout) when the file lies below it, else relative to the
working directory when it lies below that, else as given; and the dataset's name in `data.dataset`.
`resolve_data_path` finds a recorded path again: as given, then relative to the working directory,
then relative to the data root.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from routerkt.contract.vocab import Vocab
from routerkt.errors import UserError
from training.config import DataConfig
from training.data import skill_rows
from training.data.csv_reader import Interactions, read_interactions
from training.data.protocol import Fold, Sequences, load_folds_file, make_folds, make_sequences

DATA_ROOT = Path(__file__).resolve().parents[3] / "shared" / "datasets"
CANONICAL_NAMES = ("interactions.csv.gz", "interactions.csv")   # a dataset folder's file


@dataclass
class RunData:
    vocab: Vocab
    sequences: Sequences
    folds: list[Fold]
    note: str = ""          # what data.skill_rows did to the file's rows, one line (skill_rows.describe)


# ----------------------------------------------------------------------------------------------
# Paths

def _below(path: Path, base: Path) -> str | None:
    try:
        return path.relative_to(Path(os.path.abspath(base))).as_posix()
    except ValueError:
        return None


def portable_path(path: str | os.PathLike) -> str:
    """`path` as a run records it: relative to the data root or else to the working directory when
    the file lies below one of them (never the absolute path of this machine), else unchanged."""
    absolute = Path(os.path.abspath(path))
    for base in (DATA_ROOT, Path.cwd()):
        if (relative := _below(absolute, base)) is not None:
            return relative
    return Path(path).as_posix()


def dataset_name(path: str | os.PathLike) -> str:
    """The dataset a file holds: its folder's name for a dataset folder's interactions.csv[.gz],
    else the file name without its .csv / .gz suffixes."""
    p = Path(path)
    if p.name in CANONICAL_NAMES:
        return Path(os.path.abspath(p)).parent.name
    return p.name.removesuffix(".gz").removesuffix(".csv")


def portable_data(data: DataConfig) -> DataConfig:
    """`data` with a portable `path` and `dataset` filled in (kept when already set)."""
    found = resolve_data_path(data.path)
    return dataclasses.replace(data, path=portable_path(found), dataset=data.dataset or dataset_name(found))


def resolve_data_path(path: str | os.PathLike) -> Path:
    """The file a recorded path names (the path itself when none of the candidates exists)."""
    p = Path(path)
    if p.is_absolute() or p.exists():
        return p
    return DATA_ROOT / p if (DATA_ROOT / p).exists() else p


# ----------------------------------------------------------------------------------------------
# Data

def load_interactions(data: DataConfig) -> Interactions:
    """The interactions of `data.path`, the rows of multi-skill interactions handled by `data.skill_rows`."""
    return skill_rows.apply(read_interactions(resolve_data_path(data.path)), data.skill_rows)


def _sequences(data: DataConfig, vocab: Vocab | None) -> tuple[Vocab, Sequences, str]:
    inter = load_interactions(data)
    vocab = vocab if vocab is not None else Vocab.build(inter)
    seqs = make_sequences(inter, vocab, data.protocol, data.window, data.min_interactions)
    if len(seqs) == 0:
        raise UserError(f"{data.path}: no learner has >= {data.min_interactions} interactions")
    return vocab, seqs, skill_rows.describe(inter, data.skill_rows)


def load_sequences(data: DataConfig, vocab: Vocab | None = None) -> tuple[Vocab, Sequences]:
    """Read `data.path` and cut it into windows; the vocabulary is built from the data unless given
    (evaluation and export map ids with the run's own). Raises UserError on unusable data."""
    vocab, seqs, _ = _sequences(data, vocab)
    return vocab, seqs


def split_folds(data: DataConfig, seqs: Sequences) -> list[Fold]:
    """The run's folds over the learners of `seqs`: from `data.folds_file`, else K-fold by `data.seed`."""
    learners = np.unique(seqs.learners)
    if data.folds_file:
        return load_folds_file(data.folds_file, learners)
    return make_folds(learners, data.folds, data.valid_ratio, data.seed)


def load_run_data(data: DataConfig, vocab: Vocab | None = None) -> RunData:
    """Vocabulary, sequences and folds of a run's data, and the line saying how its rows were read."""
    vocab, seqs, note = _sequences(data, vocab)
    return RunData(vocab=vocab, sequences=seqs, folds=split_folds(data, seqs), note=note)
