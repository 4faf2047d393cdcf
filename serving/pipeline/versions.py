"""VersionResolver: which version of a model answers each learner of a call (the version policy over the versions the
backend serves), NOT_FOUND / UNAVAILABLE otherwise; an unknown model or version rescans the repository once."""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Sequence

from serving import status_errors as errors
from serving.status_errors import ServingError, shown

if TYPE_CHECKING:
    from serving.core.catalog import ModelCatalog, ModelVersion
    from serving.pipeline.parts import InferenceBackend, Route, VersionPolicy

MISS_REFRESH_S = 1.0        # an unknown model/version rescans the repository at most this often


class VersionResolver:
    """The catalog, the backend's readiness and the version policy, asked in that order."""

    def __init__(self, catalog: ModelCatalog, backend: InferenceBackend, policy: VersionPolicy) -> None:
        self.catalog, self.backend, self.policy = catalog, backend, policy
        self._last_miss_refresh = -1e9

    async def resolve(self, name: str, version: int, learner_ids: Sequence[str]) -> list[Route]:
        """The Route of each learner (`learner_ids`, "" when unnamed): NOT_FOUND when the repository
        lacks the model or the pinned `version` (0: none pinned), UNAVAILABLE when the backend cannot
        serve it right now; the version policy picks among the versions the backend serves."""
        versions = await self.served(name, version)
        ready = self.backend.ready_versions(name)
        return [self.policy.route(name, version, versions, ready, learner_id) for learner_id in learner_ids]

    async def served(self, name: str, version: int) -> dict[int, ModelVersion]:
        """The model's versions: NOT_FOUND when the repository lacks it (after one rate-limited
        rescan), UNAVAILABLE when the backend cannot serve it right now."""
        try:
            versions = self._versions(name, version)
        except ServingError:
            if not await self._refresh_on_miss():
                raise
            versions = self._versions(name, version)
        reason = self.backend.unavailable_reason(name)
        if reason is not None:
            raise errors.unavailable(reason)
        return versions

    def _versions(self, name: str, version: int) -> dict[int, ModelVersion]:
        versions = self.catalog.require_model(name)
        if version and version not in versions:
            raise errors.not_found(f"model {shown(name)} has no version {version} (versions: {sorted(versions)})",
                                   field="version")
        return versions

    async def _refresh_on_miss(self) -> bool:
        """Rescan the repository (rate-limited) so a fresh export is found; True if it changed."""
        now = time.monotonic()
        if now - self._last_miss_refresh < MISS_REFRESH_S:
            return False
        self._last_miss_refresh = now
        result = await asyncio.to_thread(self.catalog.refresh)
        return bool(result.added or result.removed)
