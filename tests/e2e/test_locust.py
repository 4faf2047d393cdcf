"""`routerkt bench load` end to end: a short real locust run (3 users, a few seconds) against the
tritonserver + gateway that the command starts itself on the tiny RouterKT of `kt_repository`."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_bench_load_against_triton_and_the_gateway(kt_repository, tmp_path: Path) -> None:
    out = tmp_path / "load"
    run = subprocess.run(
        [sys.executable, "-m", "routerkt.cli", "bench", "load", "--repository", str(kt_repository.path),
         "--model", kt_repository.name, "--users", "3", "--spawn-rate", "3", "--duration", "6s",
         "--user-classes", "LearnerUser:2,BatchUser:1", "--batch-learners", "4", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{(out / 'locust.log').read_text()[-3000:]}"
    assert "SLOs met" in run.stdout and "Predict" in run.stdout

    report = json.loads((out / "load.json").read_text())
    assert report["started_servers"] is True and report["model"] == "kt" and report["version"] == 1
    assert set(report["rpcs"]) == {"Predict", "PredictBatch"}
    for name, stats in [*report["rpcs"].items(), ("total", report["total"])]:
        assert stats["requests"] > 0 and stats["failures"] == 0, name
        assert stats["requests_per_s"] > 0, name
        assert 0 < stats["p50_ms"] <= stats["p95_ms"] <= stats["p99_ms"] <= report["slo"]["max_p99_ms"], name
    assert report["failure_ratio"] == 0 and report["failures"] == []
    assert report["slo"]["passed"] is True and report["locust_exit_code"] == 0
    assert report["settings"]["user_classes"] == {"LearnerUser": 2, "BatchUser": 1}

    with open(out / "locust_stats.csv", newline="") as handle:
        rows = {row["Name"]: row for row in csv.DictReader(handle)}
    assert int(rows["Aggregated"]["Failure Count"]) == 0
    assert int(rows["Aggregated"]["Request Count"]) == report["total"]["requests"]
    assert (out / "locust_failures.csv").read_text().count("\n") == 1           # the header only
    assert "Triton" in (out / "triton.log").read_text() or (out / "triton.log").stat().st_size > 0
