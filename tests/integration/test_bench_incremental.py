"""`routerkt bench incremental` end to end on the tiny model exported with --step-graphs (three real `routerkt
serve` children over in-process onnxruntime, each with its SQLite store): every path answers as the history sent
(<= 1e-5), no call fails, and the session pattern shows Observe's fill at work: with it every returning answer is
a hit and each answer filled, without it each is appended by the Predict and nothing is filled."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_bench_incremental_compares_the_paths_and_the_fill(kt_step_repository, tmp_path) -> None:
    out = tmp_path / "incremental"
    done = subprocess.run([sys.executable, "-m", "routerkt.cli", "bench", "incremental",
                           "--repository", str(kt_step_repository.path), "--histories", "8,30", "--callers", "1",
                           "--seconds", "0.4", "--learners", "3", "--burst", "3", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "incremental.json").read_text())
    assert set(report["max_abs_diff"]) == {"8", "30"} and max(report["max_abs_diff"].values()) <= 1e-5
    assert len(report["phases"]) == 4                                   # 2 histories x 2 candidate counts x 1
    for phase in report["phases"]:
        assert all(phase[mode]["calls"] > 0 and phase[mode]["failures"] == 0
                   for mode in ("on", "off", "stateless", "prefix")), phase
    rows = {(row["callers"], row["key"], row["gateway"]): row for row in report["sessions"]}
    assert set(rows) == {(c, k, g) for c in (1, 8) for k, g in (("learner", "on"), ("learner", "nofill"),
                                                                  ("history", "on"))}
    for (callers, key, gateway), row in rows.items():
        assert row["failures"] == 0 and row["visits"] > 0 and row["rounds"] == 2, row
        returning = row["lookups"]["hit"] + row["lookups"]["appended"]
        assert returning > 0, row                # (past the tiny model's window of 20 a learner rebuilds)
        if key == "learner" and gateway == "on":
            assert row["lookups"]["appended"] == 0 and row["fills"]["filled"] >= row["lookups"]["hit"], row
        elif key == "learner":
            assert row["lookups"]["hit"] == 0 and sum(row["fills"].values()) == 0, row
    assert "| 8 | learner | nofill |" in done.stdout


def test_bench_incremental_stored_pattern_on_a_band_model(kt_band_repository, tmp_path) -> None:
    """--pattern stored on the tiny band model (band 20), learners with 45 stored answers (past the band): by
    learner_id every answer after the first is served from the cache (Observe's fill, never stale), and the
    answers equal the same history sent (<= 1e-5); no call fails."""
    out = tmp_path / "stored"
    done = subprocess.run([sys.executable, "-m", "routerkt.cli", "bench", "incremental", "--pattern", "stored",
                           "--repository", str(kt_band_repository.path), "--histories", "45", "--callers", "1",
                           "--seconds", "1", "--learners", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    [row] = json.loads((out / "incremental.json").read_text())["patterns"]
    assert row["pattern"] == "stored 45" and row["max_abs_diff"] <= 1e-5, row
    assert row["on"]["failures"] == row["stateless"]["failures"] == 0, row
    assert row["lookups"]["stale"] == 0 and row["lookups"]["hit"] > 0 and row["cached_share"] > 0.5, row
    assert "| stored 45 | 1 |" in done.stdout
