"""Version policies (serving/parts.py: VersionPolicy). `LatestReadyVersion`: a request that names a
version gets that one (UNAVAILABLE while the backend does not serve it); otherwise the newest
version of the catalog that the backend serves right now. The rollout policies (pinned, canary,
shadow) build on it: serving/rollout/policy.py."""
from __future__ import annotations

from typing import Mapping

from serving import errors
from serving.catalog import ModelVersion
from serving.parts import Route


def requested_version(name: str, requested: int, versions: Mapping[int, ModelVersion],
                      ready: frozenset[int]) -> ModelVersion:
    if requested not in ready:
        raise errors.unavailable(f"model {errors.shown(name)} version {requested} is not ready; retry shortly")
    return versions[requested]


def latest_ready(name: str, versions: Mapping[int, ModelVersion], ready: frozenset[int]) -> ModelVersion:
    usable = [v for v in versions if v in ready]
    if not usable:
        raise errors.unavailable(f"model {errors.shown(name)} is not ready; retry shortly")
    return versions[max(usable)]


class LatestReadyVersion:
    """The pinned version if the request names one, else the newest ready one; no shadow."""

    def route(self, name: str, requested: int, versions: Mapping[int, ModelVersion], ready: frozenset[int],
              learner_id: str = "") -> Route:
        if requested:
            return Route(requested_version(name, requested, versions, ready))
        return Route(latest_ready(name, versions, ready))
