"""`canary`: a share `weight` of learners goes to the candidate, the rest to the baseline, sticky per
learner (a keyed hash of learner_id; calls without one are assigned at random per call). While the
candidate is not served everyone gets the baseline. `guardrail` (defaults when absent, null to
disable) lets RolloutPolicy roll the candidate back when its log loss is worse by a margin;
`promotion` (defaults when absent, null to disable) promotes or rolls back on a sequential test."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

from serving.pipeline.parts import Route
from serving.rollout.kinds.base import (SPLIT_FLAGS, Flag, Guardrail, PolicyError, Promotion, Rollout, RouteInputs,
                                        Split, count_field, share_field, split_fields, split_ready)


def _nested(value: object, where: str, fields: set[str]) -> dict | None:
    """A nested object of the entry (None for null); PolicyError names an unknown field."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise PolicyError(f"{where}: must be an object or null")
    unknown = set(value) - fields
    if unknown:
        raise PolicyError(f"{where}.{sorted(unknown)[0]}: unknown field")
    return value


def _guardrail(value: object, where: str) -> Guardrail | None:
    value = _nested(value, where, {"min_outcomes", "max_log_loss_increase"})
    if value is None:
        return None
    default = Guardrail()
    min_outcomes = count_field(value.get("min_outcomes", default.min_outcomes), f"{where}.min_outcomes")
    margin = value.get("max_log_loss_increase", default.max_log_loss_increase)
    if not isinstance(margin, (int, float)) or isinstance(margin, bool) or not math.isfinite(margin) or margin < 0:
        raise PolicyError(f"{where}.max_log_loss_increase: must be a number >= 0, got {json.dumps(margin)}")
    return Guardrail(min_outcomes, float(margin))


def _promotion(value: object, where: str) -> Promotion | None:
    value = _nested(value, where, {"alpha", "min_outcomes"})
    if value is None:
        return None
    default = Promotion()
    alpha = value.get("alpha", default.alpha)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0.0 < alpha < 1.0:
        raise PolicyError(f"{where}.alpha: must be a number in (0, 1), got {json.dumps(alpha)}")
    min_outcomes = count_field(value.get("min_outcomes", default.min_outcomes), f"{where}.min_outcomes")
    return Promotion(float(alpha), min_outcomes)


@dataclass(frozen=True)
class Canary(Rollout):
    name = "canary"
    flags = (*SPLIT_FLAGS, Flag("weight", float, "canary: share of learners on the candidate"),
             Flag("guardrail", dict, "canary: automatic rollback (object; null disables)"),
             Flag("promotion", dict, "canary: promotion or rollback by a sequential test (object; null disables)"))
    baseline: int = 0
    candidate: int = 0
    weight: float = 0.0
    guard: Guardrail | None = None
    note: str = ""
    online_test: Promotion | None = None

    @classmethod
    def parse(cls, value: Mapping[str, Any], where: str) -> "Canary":
        baseline, candidate = split_fields(value, where)
        return cls(baseline, candidate, share_field(value.get("weight"), f"{where}.weight"),
                   _guardrail(value.get("guardrail", {}), f"{where}.guardrail"), value.get("note", ""),
                   _promotion(value.get("promotion", {}), f"{where}.promotion"))

    def fields(self) -> dict[str, object]:
        guard = self.guard
        return {"baseline": self.baseline, "candidate": self.candidate, "weight": self.weight,
                "guardrail": None if guard is None else {"min_outcomes": guard.min_outcomes,
                                                         "max_log_loss_increase": guard.max_log_loss_increase},
                "promotion": None if self.online_test is None else {"alpha": self.online_test.alpha,
                                                                    "min_outcomes": self.online_test.min_outcomes}}

    def route(self, inputs: RouteInputs) -> Route:
        baseline_ok, candidate_ok = split_ready(self.split(), inputs)
        to_candidate = inputs.bucket() < self.weight
        pick = self.candidate if (to_candidate and candidate_ok) or not baseline_ok else self.baseline
        return Route(inputs.versions[pick])

    def split(self) -> Split:
        return Split(self.baseline, self.candidate)

    def guardrail(self) -> Guardrail | None:
        return self.guard

    def promotion(self) -> Promotion | None:
        return self.online_test

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
        promotion = {"alpha": options.get("alpha"), "min_outcomes": options.get("promotion_min_outcomes")}
        entry["promotion"] = None if options.get("no_promotion") else \
            {k: v for k, v in promotion.items() if v is not None}
        return entry
