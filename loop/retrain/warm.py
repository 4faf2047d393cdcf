"""Warm start: the base version's weights (loop/retrain/base_version.py) copied into a model with a grown vocabulary.

It finds the training run the base version was exported from and maps its checkpoint onto the new ids."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from routerkt.contract.model_info import ModelInfo
from routerkt.contract.vocab import Vocab


@dataclass
class WarmStart:
    state: dict
    copied: int = 0                  # tensors copied whole
    row_mapped: int = 0              # question / skill tables: rows of known ids copied, new rows fresh
    fresh: list[str] = field(default_factory=list)   # tensors whose shape no mapping explains (kept fresh)


def find_run(runs: Path, info: ModelInfo) -> Path | None:
    """The fold folder (meta.json + model.pt) the version described by `info` was exported from: a run
    folder under `runs` (or `runs` itself) whose '<folder name>-<preset>' is the version's run_id."""
    run_id, fold = info.provenance.get("run_id", ""), info.provenance.get("fold", "")
    if not run_id or not Path(runs).is_dir():
        return None
    candidates = [Path(runs)] + sorted(p for p in Path(runs).iterdir() if p.is_dir())
    for run in candidates:
        if f"{run.name}-{info.preset}" == run_id or run.name == run_id:
            folder = run / f"fold-{fold}" if fold else None
            if folder is not None and (folder / "meta.json").is_file():
                return folder
            found = sorted(run.glob("fold-*/meta.json"))
            if found:
                return found[0].parent
    return None


def _index_map(old: dict[int, int], new: dict[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(new rows, old rows) of the raw ids both vocabularies know."""
    shared = sorted(set(old) & set(new))
    new_rows = torch.tensor([new[r] for r in shared], dtype=torch.long)
    return new_rows, torch.tensor([old[r] for r in shared], dtype=torch.long)


def warm_state(fresh: dict[str, torch.Tensor], old_state: dict[str, torch.Tensor], old_vocab: Vocab,
               new_vocab: Vocab) -> WarmStart:
    """`fresh` (a newly built model's state) with every tensor of `old_state` copied: whole when the shapes
    agree, row by row along a question or skill axis (padding and unknown rows, then each raw id the old
    vocabulary knew at its new id; rows of ids new to the platform stay fresh)."""
    axes = {(old_vocab.n_questions, new_vocab.n_questions): _index_map(old_vocab.questions, new_vocab.questions),
            (old_vocab.n_skills, new_vocab.n_skills): _index_map(old_vocab.skills, new_vocab.skills)}
    result = WarmStart(state={k: v.clone() for k, v in fresh.items()})
    for name, target in result.state.items():
        source = old_state.get(name)
        if source is None or source.ndim != target.ndim:
            result.fresh.append(name)
            continue
        if source.shape == target.shape:        # a grown vocabulary contains the old one: same size, same ids
            target.copy_(source)
            result.copied += 1
            continue
        mapping = axes.get((source.shape[0], target.shape[0]))
        if mapping is None or source.shape[1:] != target.shape[1:]:
            result.fresh.append(name)
            continue
        new_rows, old_rows = mapping
        special = min(2, source.shape[0])                     # PAD_ID and UNK_ID rows
        target[:special] = source[:special]
        target[new_rows] = source[old_rows]
        result.row_mapped += 1
    return result


def warm_start(fold_dir: Path, new_model: torch.nn.Module, new_vocab: Vocab) -> WarmStart:
    """The warm initial state of `new_model` from the checkpoint in `fold_dir` (training/checkpoint.py)."""
    from training.checkpoint import load_checkpoint
    old = load_checkpoint(fold_dir)
    return warm_state(new_model.state_dict(), old.model.state_dict(), old.vocab, new_vocab)
