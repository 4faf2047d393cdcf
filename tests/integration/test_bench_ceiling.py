"""`routerkt bench ceiling` end to end on the tiny model with step graphs (a real `routerkt serve` child over
in-process onnxruntime with its SQLite store, and the do-nothing server as a child): every target answers
without a failure, Predict by learner_id is a cache hit on every call and answers as the history sent (its
step calls all counted by the batching metric), and the report carries the fraction of the ceiling and the
session pattern."""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from contextlib import closing

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


def test_bench_ceiling_over_two_gateways_routes_each_learner_to_its_own(kt_step_repository, tmp_path) -> None:
    """`--gateways 2`: two gateways (each its own store) and two do-nothing servers behind the shipped LearnerRouter:
    both stores hold learners, none holds one twice over, and every by-id call is a hit that answers as the history
    sent, so each learner's calls reached the gateway that stored it (the other holds no history for it)."""
    out = tmp_path / "ceiling2"
    done = subprocess.run([sys.executable, "-m", "routerkt.cli", "bench", "ceiling", "--gateways", "2",
                           "--repository", str(kt_step_repository.path), "--backends", "onnxruntime",
                           "--learners", "16", "--history", "8", "--callers", "2", "--seconds", "0.3",
                           "--rounds", "1", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "ceiling.json").read_text())
    assert report["gateways"] == 2 and report["max_abs_diff"] <= 1e-5
    assert sorted(p.name for p in out.glob("gateway-onnxruntime-*")) == ["gateway-onnxruntime-0", "gateway-onnxruntime-1"]
    stored = []                                   # each store's learners (16 learners on 2 gateways: both have some)
    for k in range(2):
        with closing(sqlite3.connect(out / f"gateway-onnxruntime-{k}" / "sessions.sqlite3")) as db:
            stored.append({learner for (learner,) in db.execute("SELECT learner FROM learners")})
    assert all(stored) and not stored[0] & stored[1] and len(stored[0] | stored[1]) == 16
    row = report["predict"]["2"]
    for target in ("ceiling", "onnxruntime:id", "onnxruntime:sent"):
        assert row[target]["calls"] > 0 and row[target]["failures"] == 0, (target, row[target])
    lookups = row["onnxruntime:lookups"]
    assert lookups["hit"] == row["onnxruntime:id"]["calls"] and lookups["miss"] == lookups["stale"] == 0
    assert report["sessions"]["onnxruntime"]["failures"] == 0


def test_bench_ceiling_refuses_zero_gateways(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-m", "routerkt.cli", "bench", "ceiling", "--gateways", "0",
                           "--out", str(tmp_path / "c")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--gateways" in done.stderr and done.stderr.count("\n") == 1
