"""The layering of the packages (docs/architecture.md), enforced by import-linter's contracts in
pyproject.toml: the contracts must all be there, and `lint-imports` must keep every one of them."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = {
    "Layers point down: loadtest -> loop -> serving | export -> training -> routerkt",
    "serving uses only the contract: no training, no export, no torch",
    "The contract is torch-free",
    "No import cycles inside training, export, loop or routerkt (lazy imports count)",
    "The training loop and models do not import the launcher or the run",
    "training's folders point down: cli -> bench -> paper -> eval -> the core at training's top",
    "training's core (its top modules, models, data) imports none of its folders of commands, benchmarks, "
    "evaluation or paper",
    "The pipeline and the learner-state path use the Encoder interface, never the concrete encoder",
    "No import cycles inside serving (lazy imports count)",
    "The session store interface imports no store implementation",
    "Serving transports import the service, never the server or the CLI",
    "Rollout kinds are strategies: they import neither the watcher, the file nor the CLI",
    "No import cycles inside loadtest (lazy imports count)",
    "Benchmarks do not import each other (shared parts live in loadtest/harness.py and beside it)",
    "The learning loop calls serving's API, never its own command line",
}


def test_every_layering_contract_is_declared() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert {c["name"] for c in config["contracts"]} == EXPECTED
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    assert layers == ["loadtest", "loop", "serving | export", "training", "routerkt"]


def test_import_linter_keeps_every_contract() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert f"{len(EXPECTED)} kept, 0 broken" in out.stdout
