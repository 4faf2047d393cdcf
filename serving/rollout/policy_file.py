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

Each "policy" names a rollout kind (serving/rollout/kinds/: latest, pinned, canary, shadow; a model
the file does not name gets `latest`); the kind's class validates and writes its own fields.
A request that names a version gets that version whatever the policy. `note` (any policy) is free
text; the guardrail writes one when it rolls a canary back, the sequential test (`promotion`, a
canary's, defaults when absent) when it promotes or rolls one back.

`parse_policy` validates a whole file and raises PolicyError naming the first bad field
("models.dkt.version: ..."); `write_policy` writes atomically (the watcher never sees half a file).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from routerkt.atomic import atomic_write_json
from serving.rollout.kinds import KINDS
from serving.rollout.kinds.base import PolicyError, Rollout
from serving.rollout.kinds.latest import Latest

FORMAT = 1
__all__ = ["FORMAT", "PolicyError", "RolloutPolicyFile", "parse_model", "parse_policy", "read_policy", "write_policy"]


@dataclass(frozen=True)
class RolloutPolicyFile:
    models: dict[str, Rollout] = field(default_factory=dict)

    def get(self, model: str) -> Rollout:
        return self.models.get(model, Latest())

    def to_json(self) -> dict[str, object]:
        return {"format": FORMAT, "models": {name: r.to_json() for name, r in sorted(self.models.items())}}


def parse_model(name: str, value: object) -> Rollout:
    """One model's entry, validated by its kind's class; PolicyError names the first bad field."""
    where = f"models.{name}"
    if not isinstance(value, dict):
        raise PolicyError(f"{where}: must be an object")
    kind = KINDS.get(value.get("policy")) if isinstance(value.get("policy"), str) else None
    if kind is None:
        raise PolicyError(f"{where}.policy: must be one of {list(KINDS)}, got {json.dumps(value.get('policy'))}")
    unknown = set(value) - {"policy", "note", *(flag.name for flag in kind.flags)}
    if unknown:
        raise PolicyError(f"{where}.{sorted(unknown)[0]}: not a field of a {kind.name} policy")
    if not isinstance(value.get("note", ""), str):
        raise PolicyError(f"{where}.note: must be text")
    return kind.parse(value, where)


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
