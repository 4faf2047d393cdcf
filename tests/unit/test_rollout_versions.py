"""routerkt/contract/rollout_versions.py reads the versions a policy file names as the gateway's kinds do."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from routerkt.contract.rollout_versions import named_versions, read_named_versions
from routerkt.errors import UserError
from serving.rollout.kinds import KINDS
from serving.rollout.policy_file import parse_model

pytestmark = pytest.mark.unit

ENTRIES = {"latest": {"policy": "latest"}, "pinned": {"policy": "pinned", "version": 4},
           "canary": {"policy": "canary", "baseline": 2, "candidate": 5, "weight": 0.1},
           "shadow": {"policy": "shadow", "baseline": 3, "candidate": 7, "sample": 0.5}}


def test_every_kind_is_covered_and_agrees_with_the_contract() -> None:
    assert set(ENTRIES) == set(KINDS)                       # a new kind needs its entry here
    for name, entry in ENTRIES.items():
        rollout = parse_model("kt", entry)
        assert named_versions({"models": {"kt": rollout.to_json()}}) == {"kt": rollout.versions()}, name
    assert parse_model("kt", ENTRIES["canary"]).served() == 2 and parse_model("kt", ENTRIES["latest"]).served() is None


def test_reading_the_file(tmp_path: Path) -> None:
    path = tmp_path / "rollout.json"
    assert read_named_versions(path) == {} and read_named_versions(None) == {}
    path.write_text(json.dumps({"format": 1, "models": {"a": ENTRIES["canary"], "b": ENTRIES["pinned"]}}))
    assert read_named_versions(path) == {"a": {2, 5}, "b": {4}}
    path.write_text("{")
    with pytest.raises(UserError, match="not valid JSON"):
        read_named_versions(path)
