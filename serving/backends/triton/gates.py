"""Per-model gates: count the inferences of each model inside Triton and, while a gate is closed,
hold new ones, so that a config-changing load runs with none of that model's calls in flight.

Why (docs/operations.md, "Triton 2.51 facts"): loading a version whose config.pbtxt changed makes
Triton reload every version of the model; with calls in flight, Triton 2.51's python backend died
(SIGSEGV right after "successfully unloaded ... version 1") in every run here. Held calls wait up to
their own deadline, then fail as DEADLINE, never as UNAVAILABLE.
"""
from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator

from serving.pipeline.parts import BackendError, FailureKind


class ModelGates:
    """In-flight counts and open/closed gates per model (use inside one event loop)."""

    def __init__(self) -> None:
        self._inflight: dict[str, int] = {}
        self._open: dict[str, asyncio.Event] = {}       # absent: open
        self._idle: dict[str, asyncio.Event] = {}

    def is_closed(self, model: str) -> bool:
        gate = self._open.get(model)
        return gate is not None and not gate.is_set()

    def inflight(self, model: str) -> int:
        return self._inflight.get(model, 0)

    @asynccontextmanager
    async def admitted(self, model: str, timeout_s: float) -> AsyncIterator[float]:
        """One call of `model`: waits while its gate is closed; yields the seconds left of timeout_s."""
        started = time.monotonic()
        while self.is_closed(model):
            left = timeout_s - (time.monotonic() - started)
            try:
                await asyncio.wait_for(self._open[model].wait(), max(left, 0.0))
            except asyncio.TimeoutError:
                raise BackendError(FailureKind.DEADLINE, f"model {model} was being reloaded") from None
        self._inflight[model] = self._inflight.get(model, 0) + 1
        try:
            yield max(timeout_s - (time.monotonic() - started), 0.001)
        finally:
            self._inflight[model] -= 1
            if not self._inflight[model] and model in self._idle:
                self._idle[model].set()

    @asynccontextmanager
    async def closed(self, model: str, timeout_s: float) -> AsyncIterator[int]:
        """Close `model`'s gate and wait (up to timeout_s) until none of its calls is in flight;
        yields how many were still in flight after the wait (0 unless it timed out). Reopens on exit."""
        gate = self._open.setdefault(model, asyncio.Event())
        gate.clear()
        try:
            idle = self._idle.setdefault(model, asyncio.Event())
            if self.inflight(model):
                idle.clear()
                try:
                    await asyncio.wait_for(idle.wait(), timeout_s)
                except asyncio.TimeoutError:
                    pass
            yield self.inflight(model)
        finally:
            gate.set()
