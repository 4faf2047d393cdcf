"""The retrain's calls across the layers, as commands: `routerkt sessions export`, `routerkt rollout status/set`, and the gateway's /readyz."""
from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from routerkt.errors import UserError

COMMAND_TIMEOUT_S = 3600


def routerkt(*args: str, timeout_s: float = COMMAND_TIMEOUT_S) -> str:
    """Run `routerkt ARGS` in a child process; its stdout, or UserError with its one-line error."""
    try:
        done = subprocess.run([sys.executable, "-m", "routerkt.cli", *args], capture_output=True, text=True,
                              timeout=timeout_s, env=os.environ.copy())
    except subprocess.TimeoutExpired:
        raise UserError(f"`routerkt {' '.join(args[:2])}` did not finish within {timeout_s:.0f}s") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        message = lines[-1] if lines else f"exit code {done.returncode}"
        raise UserError(message.split(": error: ", 1)[-1])
    return done.stdout


def export_store(store: str, out: Path, password_file: Path | None, ca_file: Path | None) -> dict:
    args = ["sessions", "export", "--store", store, "--out", str(out)]
    if password_file:
        args += ["--store-password-file", str(password_file)]
    if ca_file:
        args += ["--store-ca-file", str(ca_file)]
    return json.loads(routerkt(*args).strip().splitlines()[-1])


def current_policy(model: str, policy_file: Path) -> dict:
    """The model's entry of the policy file as `routerkt rollout status` prints it ({"policy": "latest"} when absent)."""
    for line in routerkt("rollout", "status", "--file", str(policy_file)).splitlines():
        if line.startswith("gateway "):
            break
        name, _, rest = line.strip().partition(": ")
        if line.startswith("  ") and name == model:
            try:
                return json.loads(rest)
            except ValueError:
                raise UserError(f"cannot read model {model}'s entry in `routerkt rollout status`: {rest[:80]}") from None
    return {"policy": "latest"}


def served_version(entry: dict, latest: int | None) -> int | None:
    """The version that answers most learners under a policy entry: pinned's version, a canary's or
    shadow's baseline, else the newest in the repository."""
    kind = entry.get("policy")
    if kind == "pinned":
        return int(entry["version"])
    if kind in ("canary", "shadow"):
        return int(entry["baseline"])
    return latest


def set_policy(model: str, policy_file: Path, *kind_and_flags: str) -> str:
    return routerkt("rollout", "set", model, *kind_and_flags, "--file", str(policy_file)).strip()


def wait_loaded(gateway: str, model: str, version: int, timeout_s: float, ca_file: Path | None = None) -> float:
    """Seconds until the gateway's /readyz lists `version` of `model` as ready; UserError after `timeout_s`."""
    url = gateway.rstrip("/") + "/readyz"
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
