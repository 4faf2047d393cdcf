"""`latest`: the newest version the backend serves (a new version takes over once it is loaded);
also the gateway's VersionPolicy when it runs without a policy file (LatestReadyVersion)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from serving import status_errors as errors
from serving.core.catalog import ModelVersion
from serving.pipeline.parts import Route
from serving.rollout.kinds.base import Rollout, RouteInputs, latest_ready, requested_version


@dataclass(frozen=True)
class Latest(Rollout):
    name = "latest"
    note: str = ""

    @classmethod
    def parse(cls, value: Mapping[str, Any], where: str) -> "Latest":
        return cls(note=value.get("note", ""))

    def fields(self) -> dict[str, object]:
        return {}

    def route(self, inputs: RouteInputs) -> Route:
        return Route(latest_ready(inputs.model, inputs.versions, inputs.ready))


class LatestReadyVersion:
    """VersionPolicy: the version the request names, else the newest ready one; no shadow."""

    def route(self, name: str, requested: int, versions: Mapping[int, ModelVersion], ready: frozenset[int],
              learner_id: str = "") -> Route:
        if requested:
            return Route(requested_version(name, requested, versions, ready))
        return Route(latest_ready(name, versions, ready))

    async def maintain(self) -> None:
        """No file to watch."""

    def status(self) -> dict[str, object]:
        return {"file": None, "error": None, "models": {}}

    async def change(self, model: str, value: object) -> dict[str, object]:
        raise errors.failed_precondition("this gateway runs without a rollout policy file")

    async def close(self) -> None: ...
