"""`shadow`: the baseline answers; the candidate also scores a share `sample` of the calls in the
background (its answers are never returned, its outcomes are tracked)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from serving.pipeline.parts import Route
from serving.rollout.kinds.base import (SPLIT_FLAGS, Flag, Rollout, RouteInputs, Split, share_field, split_fields,
                                        split_ready)


@dataclass(frozen=True)
class Shadow(Rollout):
    name = "shadow"
    flags = (*SPLIT_FLAGS, Flag("sample", float, "shadow: share of calls it also scores"))
    baseline: int = 0
    candidate: int = 0
    sample: float = 1.0
    note: str = ""

    @classmethod
    def parse(cls, value: Mapping[str, Any], where: str) -> "Shadow":
        baseline, candidate = split_fields(value, where)
        return cls(baseline, candidate, share_field(value.get("sample", 1.0), f"{where}.sample"),
                   value.get("note", ""))

    def fields(self) -> dict[str, object]:
        return {"baseline": self.baseline, "candidate": self.candidate, "sample": self.sample}

    def route(self, inputs: RouteInputs) -> Route:
        baseline_ok, candidate_ok = split_ready(self.split(), inputs)
        primary = inputs.versions[self.baseline] if baseline_ok else inputs.versions[self.candidate]
        shadow = inputs.versions[self.candidate] if baseline_ok and candidate_ok and \
            inputs.draw() < self.sample else None
        return Route(primary, shadow)

    def split(self) -> Split:
        return Split(self.baseline, self.candidate)
