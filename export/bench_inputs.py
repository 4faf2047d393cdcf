"""What the inference benchmarks compare and feed: the attention presets (standard first, the
reference), assist2009-sized vocabularies and a random batch of full windows. Shared by
`routerkt bench throughput` (loadtest/bench/throughput.py) and the GPU check (export/gpu_check.py).
Weights are random in both: speed and parity do not depend on them.
"""
from __future__ import annotations

import numpy as np

from routerkt.contract.signature import FIRST_ID, SCORE

DEFAULT_PRESETS = ("akt-standard", "routerkt-akt", "alibi-akt", "relative-akt", "akt")
N_QUESTIONS, N_SKILLS = 17_000, 120          # assist2009-sized vocabularies


def make_batch(batch: int, length: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random score-graph inputs, int64 [batch, length] each (skills [batch, length, 1]), no padding."""
    rng = np.random.default_rng(seed)
    questions, skills, responses = SCORE.input_names
    return {questions: rng.integers(FIRST_ID, N_QUESTIONS, (batch, length)).astype(np.int64),
            skills: rng.integers(FIRST_ID, N_SKILLS, (batch, length, 1)).astype(np.int64),
            responses: rng.integers(0, 2, (batch, length)).astype(np.int64)}
