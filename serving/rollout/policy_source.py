"""Where a rollout policy is read and changed: its file, or a gateway's audited API (GET / PUT /v1/rollout).

`routerkt rollout` and the learning loop (loop/retrain) both go through these; `status()` is what
`routerkt rollout status --json` prints: {"source", "file", "models": {MODEL: {"entry", "versions", "served",
"split", ["since_canary_began", "routing"]}}, ["sequential_tests", "quality"]}."""
from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Protocol

from routerkt.errors import UserError
from routerkt.urls import gateway_url
from serving.rollout.kinds import KINDS
from serving.rollout.kinds.base import Rollout
from serving.rollout.policy_file import PolicyError, RolloutPolicyFile, parse_model, read_policy, write_policy

DEFAULT_FILE = Path(".routerkt") / "rollout.json"
DERIVED = ("since_canary_began", "routing")        # what a gateway adds to an entry in GET /v1/rollout
NO_OPTIONS = {"no_guardrail": False, "min_outcomes": None, "max_log_loss_increase": None, "no_promotion": False,
              "alpha": None, "promotion_min_outcomes": None}


class PolicySource(Protocol):
    name: str

    def status(self) -> dict[str, object]: ...

    def rollout(self, model: str) -> Rollout: ...

    def change(self, model: str, rollout: Rollout) -> dict[str, object]: ...


def describe(rollout: Rollout) -> dict[str, object]:
    """A model's entry and what follows from it: the versions it names and the one most learners get."""
    split = rollout.split()
    return {"entry": rollout.to_json(), "versions": sorted(rollout.versions()), "served": rollout.served(),
            "split": None if split is None else {"baseline": split.baseline, "candidate": split.candidate}}


def make_rollout(model: str, kind: str, flags: dict[str, object], options: dict[str, object] | None = None,
                 note: str | None = None) -> Rollout:
    """A policy entry of `kind` from its flags ({"version": 3} or {"baseline": 1, "candidate": 2, "weight": 0.1})
    and the guardrail / promotion options (NO_OPTIONS's keys); PolicyError names the field that is wrong."""
    value = KINDS[kind].from_flags(flags, {**NO_OPTIONS, **(options or {})})
    if note:
        value["note"] = note
    return parse_model(model, value)


class PolicyFileSource:
    """The policy file, read and written here (atomically; a gateway watching it applies it within a second)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.name = f"policy file {path}"

    def read(self) -> RolloutPolicyFile:
        try:
            return read_policy(self.path)
        except PolicyError as exc:
            raise UserError(f"{self.path} is malformed ({exc}); fix or remove it first") from None

    def rollout(self, model: str) -> Rollout:
        return self.read().get(model)

    def change(self, model: str, rollout: Rollout) -> dict[str, object]:
        policy = self.read()
        write_policy(self.path, RolloutPolicyFile({**policy.models, model: rollout}))
        return rollout.to_json()

    def status(self) -> dict[str, object]:
        policy = self.read()
        return {"source": self.name, "file": str(self.path), "exists": self.path.exists(), "error": None,
                "models": {name: describe(r) for name, r in sorted(policy.models.items())}}


class GatewaySource:
    """A gateway's rollout API; a change needs an admin key and is audited, checked and applied there."""

    def __init__(self, gateway: str, key: str | None, context: ssl.SSLContext | None) -> None:
        self.key, self.context = key, context
        self.base = gateway_url(gateway, tls=context is not None)
        self.name = f"gateway {gateway}"

    def _call(self, method: str, path: str, body: object = None) -> dict:
        url = self.base + path
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        data = None
        if body is not None:
            data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=120, context=self.context) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            hint = " (an admin key: --api-key-file or $ROUTERKT_API_KEY)" if exc.code in (401, 403) else ""
            try:
                message = json.loads(exc.read() or b"{}").get("error", {}).get("message", "")
            except ValueError:
                message = ""
            raise UserError(f"{method} {url}: HTTP {exc.code} {message or exc.reason}{hint}") from None
        except urllib.error.URLError as exc:
            raise UserError(f"cannot reach {url}: {exc.reason}") from None
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot reach {url}: {exc}") from None

    def status(self) -> dict[str, object]:
        live = self._call("GET", "/v1/rollout")
        models = {}
        for name, entry in sorted(live.get("models", {}).items()):
            rollout = parse_model(name, {k: v for k, v in entry.items() if k not in DERIVED})
            models[name] = {**describe(rollout), **{k: entry[k] for k in DERIVED if k in entry}}
        return {"source": self.name, "file": live.get("file"), "error": live.get("error"), "models": models,
                "sequential_tests": live.get("sequential_tests", {}), "quality": live.get("quality", {})}

    def rollout(self, model: str) -> Rollout:
        entry = self.status()["models"].get(model)
        return parse_model(model, entry["entry"]) if entry else RolloutPolicyFile().get(model)

    def change(self, model: str, rollout: Rollout) -> dict[str, object]:
        return self._call("PUT", f"/v1/rollout/{model}", rollout.to_json())["policy"]
