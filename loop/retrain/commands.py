"""The retrain's calls across the layers, as commands with machine-readable output.

`routerkt sessions export`, `routerkt rollout status/set/put --json` (through the gateway or on the
file), and the gateway's /readyz."""
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
from routerkt.urls import gateway_url

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


def rollout_args(gateway: str | None, gateway_ca_file: Path | None, api_key_file: Path | None,
                 policy_file: Path | None) -> list[str]:
    """Where `routerkt rollout` reads and changes the policy: the gateway's API, or the policy file."""
    if gateway:
        return ["--gateway", gateway, *(["--tls-ca", str(gateway_ca_file)] if gateway_ca_file else []),
                *(["--api-key-file", str(api_key_file)] if api_key_file else [])]
    return ["--file", str(policy_file)]


def rollout_status(where: list[str]) -> dict:
    """`routerkt rollout status --json`: {"source", "file", "models": {MODEL: {"entry", "versions", "served",
    "split", ["since_canary_began", "routing"]}}, ["sequential_tests"]}."""
    return _json(routerkt("rollout", "status", "--json", *where), "rollout status")


def set_policy(model: str, where: list[str], *kind_and_flags: str) -> dict:
    """`routerkt rollout set MODEL KIND FLAGS --json`: the entry in force ({"source", "model", "entry", ...})."""
    return _json(routerkt("rollout", "set", model, *kind_and_flags, "--json", *where), "rollout set")


def put_policy(model: str, where: list[str], entry: dict) -> dict:
    """`routerkt rollout put MODEL ENTRY --json`: one model's whole entry (a restore)."""
    return _json(routerkt("rollout", "put", model, json.dumps(entry), "--json", *where), "rollout put")


def _json(stdout: str, command: str) -> dict:
    lines = stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        raise UserError(f"`routerkt {command} --json` printed no JSON object") from None


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
