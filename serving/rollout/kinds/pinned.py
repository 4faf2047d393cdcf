"""`pinned`: one version answers (UNAVAILABLE while it is not served)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from serving import status_errors as errors
from serving.pipeline.parts import Route
from serving.rollout.kinds.base import Flag, Rollout, RouteInputs, requested_version, version_field


@dataclass(frozen=True)
class Pinned(Rollout):
    name = "pinned"
    flags = (Flag("version", int, "pinned: the version"),)
    version: int = 0
    note: str = ""

    @classmethod
    def parse(cls, value: Mapping[str, Any], where: str) -> "Pinned":
        return cls(version_field(value.get("version"), f"{where}.version"), note=value.get("note", ""))

    def fields(self) -> dict[str, object]:
        return {"version": self.version}

    def versions(self) -> set[int]:
        return {self.version}

    def served(self) -> int | None:
        return self.version

    def route(self, inputs: RouteInputs) -> Route:
        if self.version not in inputs.versions:
            raise errors.unavailable(f"model {errors.shown(inputs.model)} is pinned to version {self.version}, "
                                     "which the repository does not hold")
        return Route(requested_version(inputs.model, self.version, inputs.versions, inputs.ready))
