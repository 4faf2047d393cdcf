"""Mini-batches of left-padded sequences as torch tensors.

Composition (`TrainConfig.batching`):
- random (default): learners are shuffled uniformly and cut into batches, then the batch order is
  shuffled; every batch is a uniform sample of the training learners.
- length_bucketed (opt-in): the shuffled learners are cut into groups of 50 batches and sorted by
  length inside each group before being cut into batches, so a batch holds learners of similar
  length. Less padding, but it changes results: each optimizer step sees only short or only long
  histories, and the per-batch mean loss weighs tokens of short batches far more (config.Batching).
With `trim` each batch is cut to its longest sequence, dropping only columns that are padding in
every row. Models are exactly invariant to the amount of left padding, so trimming changes no
prediction; it only removes wasted work (assist2009's median learner has 23 of 100).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch
from torch import Tensor

from training.config import Batching
from training.data.protocol import Sequences

GROUP = 50  # batches per length-sorting group


@dataclass
class Batch:
    questions: Tensor   # [B, L] long
    skills: Tensor      # [B, L, K] long, skill sets (PAD_ID in unused slots and at padding)
    responses: Tensor   # [B, L] long, -1 at padding
    index: np.ndarray   # [B] rows of the source Sequences

    @property
    def size(self) -> int:
        return self.questions.shape[0]

    def to(self, device: torch.device) -> "Batch":
        """The same rows with their tensors on `device` (itself when they already are)."""
        if self.questions.device == device:
            return self
        return Batch(questions=self.questions.to(device), skills=self.skills.to(device),
                     responses=self.responses.to(device), index=self.index)


def batch_order(lengths: np.ndarray, batch_size: int, shuffle: bool, batching: Batching,
                rng: np.random.Generator | None) -> list[np.ndarray]:
    """Row indices of each batch. The random order draws exactly what versions before `batching`
    drew with `length_buckets=false`, so their runs replay."""
    n = len(lengths)
    order = rng.permutation(n) if shuffle and rng is not None else np.arange(n)
    if Batching(batching) is Batching.LENGTH_BUCKETED:
        group = batch_size * GROUP
        parts = [chunk[np.argsort(-lengths[chunk], kind="stable")] for chunk in
                 (order[i:i + group] for i in range(0, n, group))]
        order = np.concatenate(parts) if parts else order
    batches = [order[i:i + batch_size] for i in range(0, n, batch_size)]
    if shuffle and rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def trimmed_width(lengths: np.ndarray, window: int) -> int:
    """Columns a batch keeps: its longest sequence (at least 1) — every dropped column is padding in every row."""
    return max(int(lengths.max()) if len(lengths) else window, 1)


def iterate(seqs: Sequences, batch_size: int, *, shuffle: bool = False, batching: Batching = Batching.RANDOM,
            seed: int = 0, trim: bool = True) -> Iterator[Batch]:
    rng = np.random.default_rng(seed)
    for idx in batch_order(seqs.lengths, batch_size, shuffle, batching, rng):
        width = trimmed_width(seqs.lengths[idx], seqs.questions.shape[1]) if trim else seqs.questions.shape[1]
        width = max(width, 1)
        cols = slice(seqs.questions.shape[1] - width, None)
        yield Batch(questions=torch.from_numpy(seqs.questions[idx, cols]),
                    skills=torch.from_numpy(seqs.skills[idx, cols]),
                    responses=torch.from_numpy(seqs.responses[idx, cols]),
                    index=idx)
