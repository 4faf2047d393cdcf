"""Mini-batches of left-padded sequences as torch tensors, with length bucketing.

With `length_buckets`, training batches hold learners of similar length: indices are shuffled,
cut into groups of 50 batches, sorted by length inside each group, split into batches, and the
batch order is shuffled. Each batch is trimmed to its longest sequence (dropping columns that are
padding for every row). Models are exactly invariant to the amount of left padding, so trimming
changes no prediction; it only removes wasted work (assist2009's median learner has 23 of 100).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch
from torch import Tensor

from training.data.protocol import Sequences

GROUP = 50  # batches per length-sorting group


@dataclass
class Batch:
    questions: Tensor   # [B, L] long
    skills: Tensor      # [B, L] long
    responses: Tensor   # [B, L] long, -1 at padding
    index: np.ndarray   # [B] rows of the source Sequences

    @property
    def size(self) -> int:
        return self.questions.shape[0]


def batch_order(lengths: np.ndarray, batch_size: int, shuffle: bool, buckets: bool,
                rng: np.random.Generator | None) -> list[np.ndarray]:
    n = len(lengths)
    order = rng.permutation(n) if shuffle and rng is not None else np.arange(n)
    if buckets:
        group = batch_size * GROUP
        parts = [chunk[np.argsort(-lengths[chunk], kind="stable")] for chunk in
                 (order[i:i + group] for i in range(0, n, group))]
        order = np.concatenate(parts) if parts else order
    batches = [order[i:i + batch_size] for i in range(0, n, batch_size)]
    if shuffle and rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def iterate(seqs: Sequences, batch_size: int, *, shuffle: bool = False, buckets: bool = True,
            seed: int = 0, trim: bool = True) -> Iterator[Batch]:
    rng = np.random.default_rng(seed)
    for idx in batch_order(seqs.lengths, batch_size, shuffle, buckets, rng):
        width = int(seqs.lengths[idx].max()) if trim and len(idx) else seqs.questions.shape[1]
        width = max(width, 1)
        cols = slice(seqs.questions.shape[1] - width, None)
        yield Batch(questions=torch.from_numpy(seqs.questions[idx, cols]),
                    skills=torch.from_numpy(seqs.skills[idx, cols]),
                    responses=torch.from_numpy(seqs.responses[idx, cols]),
                    index=idx)
