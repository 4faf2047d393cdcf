"""The rollout policy file: which version of each model answers, as JSON the gateway watches.

    {
      "format": 1,
      "models": {
        "routerkt-akt": {"policy": "canary", "baseline": 1, "candidate": 2, "weight": 0.2,
                         "guardrail": {"min_outcomes": 500, "max_log_loss_increase": 0.02}},
        "dkt":          {"policy": "pinned", "version": 3},
        "simplekt":     {"policy": "shadow", "baseline": 4, "candidate": 5, "sample": 0.25}
      }
    }

Policies (a model the file does not name gets `latest`):
- latest:  the newest version the backend serves (a new version takes over once it is loaded).
- pinned:  `version` only (UNAVAILABLE while it is not served).
- canary:  a share `weight` of learners goes to `candidate`, the rest to `baseline`; sticky per
           learner (a keyed hash of learner_id, so one learner always sees one version). Calls that
           carry the history instead of a learner_id are assigned at random per call. While the
           candidate is not served, everyone gets the baseline. `guardrail` (optional; the defaults
           above when absent, `null` to disable): once both versions have `min_outcomes` outcomes
           since the canary began, the candidate is rolled back when its mean log loss exceeds the
           baseline's by more than `max_log_loss_increase`.
- shadow:  `baseline` answers; `candidate` also scores a share `sample` of the calls in the
           background; its answers are never returned, its outcomes are tracked.
A request that names a version gets that version whatever the policy. `note` (any policy) is free
text; the guardrail writes one when it rolls a canary back.

`parse_policy` validates a whole file and raises PolicyError naming the first bad field
("models.dkt.version: ..."); `write_policy` writes atomically (the watcher never sees half a file).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from routerkt.atomic import atomic_write_json

FORMAT = 1


class PolicyError(ValueError):
    """The policy file is malformed; str() names the field."""


class PolicyKind(str, Enum):
    LATEST = "latest"
    PINNED = "pinned"
    CANARY = "canary"
    SHADOW = "shadow"


@dataclass(frozen=True)
class Guardrail:
    min_outcomes: int = 500                 # per version, counted since the canary began
    max_log_loss_increase: float = 0.02     # candidate mean log loss - baseline mean log loss


@dataclass(frozen=True)
class ModelRollout:
    kind: PolicyKind = PolicyKind.LATEST
    version: int = 0                        # pinned
    baseline: int = 0                       # canary, shadow
    candidate: int = 0                      # canary, shadow
    weight: float = 0.0                     # canary: share of learners on the candidate
    sample: float = 1.0                     # shadow: share of calls the candidate also scores
    guardrail: Guardrail | None = None      # canary only
    note: str = ""

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"policy": self.kind.value}
        if self.kind is PolicyKind.PINNED:
            out["version"] = self.version
        if self.kind in (PolicyKind.CANARY, PolicyKind.SHADOW):
            out.update(baseline=self.baseline, candidate=self.candidate)
        if self.kind is PolicyKind.CANARY:
            out["weight"] = self.weight
            out["guardrail"] = None if self.guardrail is None else {
                "min_outcomes": self.guardrail.min_outcomes,
                "max_log_loss_increase": self.guardrail.max_log_loss_increase}
        if self.kind is PolicyKind.SHADOW:
            out["sample"] = self.sample
        if self.note:
            out["note"] = self.note
        return out


@dataclass(frozen=True)
class RolloutPolicyFile:
    models: dict[str, ModelRollout] = field(default_factory=dict)

    def get(self, model: str) -> ModelRollout:
        return self.models.get(model, ModelRollout())

    def to_json(self) -> dict[str, object]:
        return {"format": FORMAT, "models": {name: r.to_json() for name, r in sorted(self.models.items())}}


def _version(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PolicyError(f"{where}: must be a version number >= 1, got {json.dumps(value)}")
    return value


def _share(value: object, where: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
            or not 0.0 <= value <= 1.0:
        raise PolicyError(f"{where}: must be a number in [0, 1], got {json.dumps(value)}")
    return float(value)


ALLOWED = {
    PolicyKind.LATEST: {"policy", "note"},
    PolicyKind.PINNED: {"policy", "version", "note"},
    PolicyKind.CANARY: {"policy", "baseline", "candidate", "weight", "guardrail", "note"},
    PolicyKind.SHADOW: {"policy", "baseline", "candidate", "sample", "note"},
}


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


def parse_model(name: str, value: object) -> ModelRollout:
    where = f"models.{name}"
    if not isinstance(value, dict):
        raise PolicyError(f"{where}: must be an object")
    try:
        kind = PolicyKind(value.get("policy"))
    except ValueError:
        raise PolicyError(f"{where}.policy: must be one of {[k.value for k in PolicyKind]}, "
                          f"got {json.dumps(value.get('policy'))}") from None
    unknown = set(value) - ALLOWED[kind]
    if unknown:
        raise PolicyError(f"{where}.{sorted(unknown)[0]}: not a field of a {kind.value} policy")
    note = value.get("note", "")
    if not isinstance(note, str):
        raise PolicyError(f"{where}.note: must be text")
    if kind is PolicyKind.LATEST:
        return ModelRollout(kind, note=note)
    if kind is PolicyKind.PINNED:
        return ModelRollout(kind, version=_version(value.get("version"), f"{where}.version"), note=note)
    baseline = _version(value.get("baseline"), f"{where}.baseline")
    candidate = _version(value.get("candidate"), f"{where}.candidate")
    if baseline == candidate:
        raise PolicyError(f"{where}.candidate: must differ from the baseline ({baseline})")
    if kind is PolicyKind.CANARY:
        return ModelRollout(kind, baseline=baseline, candidate=candidate,
                            weight=_share(value.get("weight"), f"{where}.weight"),
                            guardrail=_guardrail(value.get("guardrail", {}), f"{where}.guardrail"), note=note)
    return ModelRollout(kind, baseline=baseline, candidate=candidate,
                        sample=_share(value.get("sample", 1.0), f"{where}.sample"), note=note)


def parse_policy(text: str) -> RolloutPolicyFile:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PolicyError(f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    if not isinstance(data, dict):
        raise PolicyError("the file must hold a JSON object")
    unknown = set(data) - {"format", "models"}
    if unknown:
        raise PolicyError(f"{sorted(unknown)[0]}: unknown field")
    if data.get("format", FORMAT) != FORMAT:
        raise PolicyError(f"format: must be {FORMAT}, got {json.dumps(data.get('format'))}")
    models = data.get("models", {})
    if not isinstance(models, dict):
        raise PolicyError("models: must be an object of model name -> policy")
    return RolloutPolicyFile({str(name): parse_model(str(name), value) for name, value in models.items()})


def read_policy(path: Path) -> RolloutPolicyFile:
    """The file's policy; an absent file is `latest` everywhere. PolicyError when malformed."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return RolloutPolicyFile()
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"cannot read it: {exc}") from None
    return parse_policy(text)


def write_policy(path: Path, policy: RolloutPolicyFile) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(path), policy.to_json())
