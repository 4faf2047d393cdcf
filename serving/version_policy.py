"""Version policies (serving/parts.py: VersionPolicy). `LatestReadyVersion`: a request that names a
version gets that one (UNAVAILABLE while the backend does not serve it); otherwise the newest
version of the catalog that the backend serves right now."""
from __future__ import annotations

from typing import Mapping

from serving import errors
from serving.catalog import ModelVersion


class LatestReadyVersion:
    """The pinned version if the request names one, else the newest ready one."""

    def choose(self, name: str, requested: int, versions: Mapping[int, ModelVersion],
               ready: frozenset[int]) -> ModelVersion:
        if requested:
            if requested not in ready:
                raise errors.unavailable(f"model {errors.shown(name)} version {requested} is not ready; retry shortly")
            return versions[requested]
        usable = [v for v in versions if v in ready]
        if not usable:
            raise errors.unavailable(f"model {errors.shown(name)} is not ready; retry shortly")
        return versions[max(usable)]
