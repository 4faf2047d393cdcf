"""`routerkt bench ceiling` end to end on the tiny model with step graphs (a real `routerkt serve` child over
in-process onnxruntime with its SQLite store, and the do-nothing server as a child): every target answers
without a failure, Predict by learner_id is a cache hit on every call and answers as the history sent (its
step calls all counted by the batching metric), and the report carries the fraction of the ceiling and the
session pattern."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_bench_ceiling_puts_the_gateway_beside_the_do_nothing_server(kt_step_repository, tmp_path) -> None:
    out = tmp_path / "ceiling"
    done = subprocess.run([sys.executable, "-m", "routerkt.cli", "bench", "ceiling",
                           "--repository", str(kt_step_repository.path), "--backends", "onnxruntime",
                           "--learners", "2", "--history", "8", "--callers", "1,2", "--seconds", "0.3",
                           "--rounds", "1", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "ceiling.json").read_text())
    assert report["max_abs_diff"] <= 1e-5
    for callers in ("1", "2"):
        row = report["predict"][callers]
        for target in ("ceiling", "onnxruntime:id", "onnxruntime:sent"):
            assert row[target]["calls"] > 0 and row[target]["failures"] == 0, (callers, target, row[target])
        lookups = row["onnxruntime:lookups"]
        assert lookups["hit"] == row["onnxruntime:id"]["calls"] and lookups["miss"] == lookups["stale"] == 0
        assert 0 < row["onnxruntime:id"]["calls_per_s"] / row["ceiling"]["calls_per_s"]
        batching = row["onnxruntime:batching"]                 # one step_next per hit, some merged or not
        assert batching["sum"] == row["onnxruntime:id"]["calls"] and 1 <= batching["count"] <= batching["sum"]
    sessions = report["sessions"]
    assert sessions["ceiling"]["calls"] > 0 and sessions["onnxruntime"]["failures"] == 0
    assert sessions["onnxruntime:lookups"]["hit"] + sessions["onnxruntime:lookups"]["appended"] > 0
    assert "| 2 | onnxruntime |" in done.stdout and "| session pattern, 8 callers |" in done.stdout
    assert "| 1 | onnxruntime |" in done.stdout
