"""The rollout-kind interface: each kind (latest, pinned, canary, shadow, ...) is one small frozen
dataclass that parses its JSON entry, writes it back, routes a learner, and declares its command-line
flags; serving/rollout/kinds/__init__.py maps kind names to classes (KINDS)."""
from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

from serving import status_errors as errors
from serving.core.catalog import ModelVersion
from serving.pipeline.parts import Route


class PolicyError(ValueError):
    """The policy file is malformed; str() names the field."""


@dataclass(frozen=True)
class Flag:
    """A field of a kind's JSON entry that `routerkt rollout set` takes as --<name>."""

    name: str                 # the JSON field (the flag is --name with "_" -> "-")
    type: type
    help: str


@dataclass(frozen=True)
class RouteInputs:
    """What a kind routes on: the model's versions, the ready ones, and the learner's draw."""

    model: str
    versions: Mapping[int, ModelVersion]
    ready: frozenset[int]
    bucket: Callable[[], float]        # the learner's sticky position in [0, 1) (random without a learner id)
    draw: Callable[[], float]          # a fresh random number in [0, 1) per call


@dataclass(frozen=True)
class Split:
    """The two versions of a kind that compares a candidate with a baseline."""

    baseline: int
    candidate: int


@dataclass(frozen=True)
class Guardrail:
    """Roll a canary back when its mean log loss exceeds the baseline's by more than the margin."""

    min_outcomes: int = 500                 # per version, counted since the canary began
    max_log_loss_increase: float = 0.02     # candidate mean log loss - baseline mean log loss


@dataclass(frozen=True)
class Promotion:
    """Promote or roll back a canary on an anytime-valid sequential test at level alpha
    (serving/rollout/sequential.py), once both versions have min_outcomes since the canary began."""

    alpha: float = 0.05
    min_outcomes: int = 200


class Rollout(ABC):
    """One model's rollout: a kind and its fields (subclasses are frozen dataclasses)."""

    name: ClassVar[str]
    flags: ClassVar[tuple[Flag, ...]] = ()
    note: str

    @classmethod
    @abstractmethod
    def parse(cls, value: Mapping[str, Any], where: str) -> "Rollout":
        """The kind's fields from its JSON entry (only the kind's own fields, checked by the caller)."""

    @abstractmethod
    def fields(self) -> dict[str, object]:
        """The kind's JSON fields, without "policy" and "note"."""

    @abstractmethod
    def route(self, inputs: RouteInputs) -> Route:
        """The version that answers (and a shadow), or a ServingError (UNAVAILABLE)."""

    def allowed(self) -> set[str]:
        return {"policy", "note", *(flag.name for flag in self.flags)}

    def split(self) -> Split | None:
        """Baseline and candidate for kinds that compare two versions (promote, rollback, outcomes)."""
        return None

    def served(self) -> int | None:
        """The version that answers most learners (a split's baseline); None: the newest that answers."""
        split = self.split()
        return split.baseline if split is not None else None

    def versions(self) -> set[int]:
        """The versions this entry names: they must stay loaded while it is in force (the fields
        routerkt/contract/rollout_versions.py reads for publishers)."""
        split = self.split()
        return {split.baseline, split.candidate} if split is not None else set()

    def guardrail(self) -> Guardrail | None:
        return None

    def promotion(self) -> Promotion | None:
        return None

    def candidate_weight(self) -> float:
        """The share of learners on a candidate (the routerkt_rollout_weight gauge)."""
        return 0.0

    @classmethod
    def from_flags(cls, values: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
        """The JSON entry from `routerkt rollout set` flags: `values` holds every field flag given (one
        that is not the kind's is refused by parsing, naming it); `options`: switches such as
        no_guardrail, for kinds with nested fields, which override this."""
        return {"policy": cls.name, **values}

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"policy": self.name, **self.fields()}
        if self.note:
            out["note"] = self.note
        return out


# -- field checks shared by the kinds -------------------------------------------------------------
def version_field(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PolicyError(f"{where}: must be a version number >= 1, got {json.dumps(value)}")
    return value


def share_field(value: object, where: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
            or not 0.0 <= value <= 1.0:
        raise PolicyError(f"{where}: must be a number in [0, 1], got {json.dumps(value)}")
    return float(value)


def count_field(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PolicyError(f"{where}: must be an integer >= 1, got {json.dumps(value)}")
    return value


def split_fields(value: Mapping[str, Any], where: str) -> tuple[int, int]:
    baseline = version_field(value.get("baseline"), f"{where}.baseline")
    candidate = version_field(value.get("candidate"), f"{where}.candidate")
    if baseline == candidate:
        raise PolicyError(f"{where}.candidate: must differ from the baseline ({baseline})")
    return baseline, candidate


SPLIT_FLAGS = (Flag("baseline", int, "canary/shadow: the version answering today"),
               Flag("candidate", int, "canary/shadow: the new version"))


# -- routing helpers ------------------------------------------------------------------------------
def requested_version(name: str, requested: int, versions: Mapping[int, ModelVersion],
                      ready: frozenset[int]) -> ModelVersion:
    """The version a request names (UNAVAILABLE while the backend does not serve it)."""
    if requested not in ready:
        raise errors.unavailable(f"model {errors.shown(name)} version {requested} is not ready; retry shortly")
    return versions[requested]


def latest_ready(name: str, versions: Mapping[int, ModelVersion], ready: frozenset[int]) -> ModelVersion:
    """The newest version of the catalog that the backend serves right now."""
    usable = [v for v in versions if v in ready]
    if not usable:
        raise errors.unavailable(f"model {errors.shown(name)} is not ready; retry shortly")
    return versions[max(usable)]


def split_ready(split: Split, inputs: RouteInputs) -> tuple[bool, bool]:
    """(baseline ready, candidate ready); UNAVAILABLE when neither is."""
    baseline_ok = split.baseline in inputs.versions and split.baseline in inputs.ready
    candidate_ok = split.candidate in inputs.versions and split.candidate in inputs.ready
    if not baseline_ok and not candidate_ok:
        raise errors.unavailable(f"model {errors.shown(inputs.model)} versions {split.baseline} and "
                                 f"{split.candidate} are not ready; retry shortly")
    return baseline_ok, candidate_ok
