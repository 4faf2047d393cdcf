"""The retrain's calls into serving's public API: the store's export, the rollout policy (through the gateway's
audited API or in its file) and the gateway's /readyz. In process, no child `routerkt` commands."""
from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import asdict
from pathlib import Path

from routerkt.errors import UserError
from routerkt.urls import gateway_url
from serving.rollout.kinds.pinned import Pinned
from serving.rollout.policy_file import PolicyError, parse_model
from serving.rollout.policy_source import GatewaySource, PolicyFileSource, PolicySource, describe, make_rollout
from serving.security.client_flags import context_from, key_from
from serving.sessions.cli_sessions_export import export_to_file


def export_store(store: str, out: Path, password_file: Path | None, ca_file: Path | None) -> dict:
    """Every learner's events to `out` (the canonical CSV, atomic, 0600); `routerkt sessions export`'s JSON."""
    return asdict(export_to_file(store, out, password_file=password_file, ca_file=ca_file))


def policy_source(gateway: str | None, gateway_ca_file: Path | None, api_key_file: Path | None,
                  policy_file: Path) -> PolicySource:
    """Where the policy is read and changed: the gateway's API (its admin key and CA), else the policy file."""
    if gateway:
        return GatewaySource(gateway, key_from(api_key_file), context_from(gateway_ca_file, "--gateway-ca-file"))
    return PolicyFileSource(policy_file)


def pin(source: PolicySource, model: str, version: int) -> dict:
    """Pin `model` to `version`: the entry in force ({"source", "model", "entry", "versions", "served", "split"})."""
    return _change(source, model, Pinned(version))


def start_canary(source: PolicySource, model: str, baseline: int, candidate: int, weight: float,
                 note: str | None = None) -> dict:
    """A canary of `candidate` over `baseline` for `weight` of the learners (default guardrail and promotion)."""
    try:
        rollout = make_rollout(model, "canary", {"baseline": baseline, "candidate": candidate, "weight": weight},
                               note=note)
    except PolicyError as exc:
        raise UserError(f"canary of {model}: {exc}") from None
    return _change(source, model, rollout)


def put_entry(source: PolicySource, model: str, entry: dict) -> dict:
    """One model's whole entry (a restore), as `status()["models"][model]["entry"]` gave it."""
    try:
        rollout = parse_model(model, entry)
    except PolicyError as exc:
        raise UserError(f"entry of {model}: {exc}") from None
    return _change(source, model, rollout)


def _change(source: PolicySource, model: str, rollout) -> dict:
    in_force = source.change(model, rollout)
    return {"source": source.name, "model": model, **describe(parse_model(model, in_force))}


def wait_loaded(gateway: str, model: str, version: int, timeout_s: float, ca_file: Path | None = None) -> float:
    """Seconds until the gateway's /readyz lists `version` of `model` as ready; UserError after `timeout_s`."""
    url = gateway_url(gateway, tls=ca_file is not None) + "/readyz"
    context = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            with urllib.request.urlopen(url, timeout=5, context=context) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:            # 503 while not ready still carries the body
            body = json.loads(exc.read() or b"{}") if exc.code == 503 else {}
        except (urllib.error.URLError, OSError, ValueError):
            body = {}
        if version in body.get("models", {}).get(model, []):
            return time.monotonic() - started
        time.sleep(0.5)
    raise UserError(f"the gateway {gateway} did not report {model} version {version} ready within {timeout_s:.0f}s")
