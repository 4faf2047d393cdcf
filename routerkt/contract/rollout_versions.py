"""The versions a rollout policy file names, per model: what a publisher must never prune.

The gateway's rollout kinds (serving/rollout/kinds/) name versions in three fields of a model's
entry: `version` (pinned), `baseline` and `candidate` (canary, shadow). Export and retrain read them
here, without the gateway's code; tests/unit/test_rollout_versions.py keeps this list equal to
every kind's `Rollout.versions()`.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from routerkt.errors import UserError

VERSION_FIELDS = ("version", "baseline", "candidate")


def entry_versions(entry: object) -> set[int]:
    """The versions one model's policy entry names (empty for `latest` or anything malformed)."""
    if not isinstance(entry, dict):
        return set()
    return {v for v in (entry.get(f) for f in VERSION_FIELDS)
            if isinstance(v, int) and not isinstance(v, bool) and v >= 1}


def named_versions(policy: object) -> dict[str, set[int]]:
    """Model name -> the versions its entry names, from a policy file's parsed JSON."""
    models = policy.get("models", {}) if isinstance(policy, dict) else {}
    if not isinstance(models, dict):
        return {}
    return {str(name): entry_versions(entry) for name, entry in models.items()}


def read_named_versions(path: str | os.PathLike | None) -> dict[str, set[int]]:
    """named_versions() of the file at `path`; {} when there is none. UserError when unreadable or not
    JSON: a publisher must not prune what it cannot tell is unused."""
    if path is None:
        return {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read the rollout policy file {path}: {exc}") from None
    try:
        return named_versions(json.loads(text))
    except json.JSONDecodeError as exc:
        raise UserError(f"the rollout policy file {path} is not valid JSON (line {exc.lineno}): "
                        "fix it before publishing") from None
