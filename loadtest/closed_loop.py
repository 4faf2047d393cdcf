"""Closed-loop load phases for the benchmarks: N caller threads call back to back for a while.

`run_phase(call, callers, seconds)` returns each successful call's latency, the failures (a name
per failed call: the gRPC status code name, else the exception's class) and the wall time;
`summary` turns that into calls/s and p50 / p99. Used by `bench replicas` and `bench cost`.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np


def _failure_name(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    if callable(code):
        try:
            return code().name
        except Exception:  # noqa: BLE001 - an object with an odd code(): name its class instead
            pass
    return type(exc).__name__


def run_phase(call: Callable[[], object], callers: int, seconds: float) -> tuple[list[float], list[str], float]:
    """(latencies s, failure names, wall s) of `callers` threads calling `call()` for `seconds`."""
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def caller() -> None:
        mine, bad = [], []
        while time.monotonic() < end:
            started = time.perf_counter()
            try:
                call()
                mine.append(time.perf_counter() - started)
            except Exception as exc:  # noqa: BLE001 - every failed call is counted by its name
                bad.append(_failure_name(exc))
        with lock:
            latencies.extend(mine)
            failures.extend(bad)

    threads = [threading.Thread(target=caller) for _ in range(callers)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, failures, time.monotonic() - started


def summary(latencies: list[float], failures: list[str], wall: float) -> dict:
    ms = np.asarray(latencies) * 1e3
    return {"calls": len(latencies), "failures": len(failures), "seconds": round(wall, 3),
            "calls_per_s": len(latencies) / wall if wall > 0 else 0.0,
            "p50_ms": float(np.percentile(ms, 50)) if len(ms) else None,
            "p99_ms": float(np.percentile(ms, 99)) if len(ms) else None}


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc; 0.0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0
