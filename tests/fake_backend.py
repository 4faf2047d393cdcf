"""What the fake inference backends of the tests share: the lifecycle of an InferenceBackend
(serving/pipeline/parts.py) that has nothing to connect, maintain or load. A fake subclasses it and
adds what it answers (ready_versions, ready_models, serving, unavailable_reason, describe, infer,
infer_outputs); it has no step graphs (steps: False)."""
from __future__ import annotations

import asyncio


class IdleBackend:
    """start keeps the catalog, maintain waits until cancelled, wake and close do nothing, and
    ensure_ready loads nothing: a version is ready when `ready_versions` says so."""

    catalog = None

    async def start(self, catalog) -> None:
        self.catalog = catalog

    async def maintain(self, catalog) -> None:
        await asyncio.Event().wait()

    def wake(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def ready_versions(self, model: str) -> frozenset[int]:
        raise NotImplementedError

    async def ensure_ready(self, model: str, version: int, timeout_s: float) -> bool:
        return version in self.ready_versions(model)

    def holds_states(self, model) -> bool:
        return False

    def steps(self, model) -> bool:
        return False

    async def infer_step(self, model, graph, feeds, timeout_s):
        raise AssertionError("the fake backends have no step graphs")
