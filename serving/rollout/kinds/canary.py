"""`canary`: a share `weight` of learners goes to the candidate, the rest to the baseline, sticky per
learner (a keyed hash of learner_id; calls without one are assigned at random per call). While the
candidate is not served everyone gets the baseline. `guardrail` (defaults when absent, null to
disable) lets RolloutPolicy roll the candidate back when its log loss is worse by a margin."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

from serving.parts import Route
from serving.rollout.kinds.base import (SPLIT_FLAGS, Flag, Guardrail, PolicyError, Rollout, RouteInputs, Split,
                                        share_field, split_fields, split_ready)


def _guardrail(value: object, where: str) -> Guardrail | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise PolicyError(f"{where}: must be an object or null")
    unknown = set(value) - {"min_outcomes", "max_log_loss_increase"}
    if unknown:
        raise PolicyError(f"{where}.{sorted(unknown)[0]}: unknown field")
    default = Guardrail()
    m = value.get("min_outcomes", default.min_outcomes)
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise PolicyError(f"{where}.min_outcomes: must be an integer >= 1, got {json.dumps(m)}")
    margin = value.get("max_log_loss_increase", default.max_log_loss_increase)
    if not isinstance(margin, (int, float)) or isinstance(margin, bool) or not math.isfinite(margin) or margin < 0:
        raise PolicyError(f"{where}.max_log_loss_increase: must be a number >= 0, got {json.dumps(margin)}")
    return Guardrail(m, float(margin))


@dataclass(frozen=True)
class Canary(Rollout):
    name = "canary"
    flags = (*SPLIT_FLAGS, Flag("weight", float, "canary: share of learners on the candidate"),
             Flag("guardrail", dict, "canary: automatic rollback (object; null disables)"))
    baseline: int = 0
    candidate: int = 0
    weight: float = 0.0
    guard: Guardrail | None = None
    note: str = ""

    @classmethod
    def parse(cls, value: Mapping[str, Any], where: str) -> "Canary":
        baseline, candidate = split_fields(value, where)
        return cls(baseline, candidate, share_field(value.get("weight"), f"{where}.weight"),
                   _guardrail(value.get("guardrail", {}), f"{where}.guardrail"), value.get("note", ""))

    def fields(self) -> dict[str, object]:
        guard = self.guard
        return {"baseline": self.baseline, "candidate": self.candidate, "weight": self.weight,
                "guardrail": None if guard is None else {"min_outcomes": guard.min_outcomes,
                                                         "max_log_loss_increase": guard.max_log_loss_increase}}

    def route(self, inputs: RouteInputs) -> Route:
        baseline_ok, candidate_ok = split_ready(self.split(), inputs)
        to_candidate = inputs.bucket() < self.weight
        pick = self.candidate if (to_candidate and candidate_ok) or not baseline_ok else self.baseline
        return Route(inputs.versions[pick])

    def split(self) -> Split:
        return Split(self.baseline, self.candidate)

    def guardrail(self) -> Guardrail | None:
        return self.guard

    def candidate_weight(self) -> float:
        return self.weight

    @classmethod
    def from_flags(cls, values: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
        entry = super().from_flags(values, options)
        if options.get("no_guardrail"):
            entry["guardrail"] = None
        else:
            entry["guardrail"] = {k: options[k] for k in ("min_outcomes", "max_log_loss_increase")
                                  if options.get(k) is not None}
        return entry
