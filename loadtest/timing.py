"""Timing helpers the benchmarks share: one call's seconds, the CPU's float32 matmul peak."""
from __future__ import annotations

import time

import numpy as np


def matmul_peak_gflops(n: int = 2048, repeats: int = 5) -> float:
    """Best-of-`repeats` float32 n x n matmul rate of numpy's BLAS, GFLOP/s."""
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    a @ b
    best = min(timed(lambda: a @ b) for _ in range(repeats))
    return 2 * n ** 3 / best / 1e9


def timed(fn) -> float:
    """Seconds one call of `fn` takes."""
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started
