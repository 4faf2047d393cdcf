"""`routerkt bench loop --quick` end to end on a small synthetic file (real Triton, the real gateway and its SQLite
store, `routerkt train`, `export` and `retrain` as child processes): the table has every day, no call failed, the
retrain answered each night (trained and compared, or held off while its canary is undecided), and the static v1
arm saw the same window as the served calls v1 answered."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROUTERKT = [sys.executable, "-m", "routerkt.cli"]
DAYS = 3


def test_quick_replay_runs_every_day_and_night_without_a_failed_call(tmp_path) -> None:
    data, out = tmp_path / "synthetic.csv", tmp_path / "loop"
    subprocess.run([*ROUTERKT, "synth", "--out", str(data), "--learners", "40", "--seed", "3"], check=True,
                   capture_output=True, timeout=120)
    done = subprocess.run([*ROUTERKT, "bench", "loop", "--quick", "--data", str(data), "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"\n{done.stdout}")
    report = json.loads((out / "loop.json").read_text())
    rows = report["rows"]
    assert [r["day"] for r in rows] == list(range(1, DAYS + 1))
    assert report["totals"]["failed_calls"] == 0
    for row in rows:
        assert row["failed_calls"] == 0, row["errors"]
        assert row["answers"] > 0 and row["served"]["n"] == row["static_v1"]["n"] == row["answers"]
        assert row["calls"] == {"Predict": row["answers"], "static Predict": row["answers"], "Observe": row["answers"]}
        assert abs(sum(row["versions"].values()) - 1) < 1e-6
        night = row["retrain"]                                            # the retrain ran, and answered
        assert night["exit"] in (0, 3) and night["seconds"] > 0, night
        assert night["report_outcome"] in ("published", "not_better", "canary_undecided"), night
        if night["report_outcome"] == "canary_undecided":                # held off: the canary met is undecided
            assert night["canary_met"] and night["canary_met"]["replace"] is False, night
            assert night["candidate"] == {} and night["new_version"] is None, night
        else:                                                             # trained, and compared on held-out data
            assert night["served"]["n"] > 0 and night["candidate"]["n"] == night["served"]["n"], night
        if row["v1_parity_max_abs"] is not None:                          # the same window on both sides
            assert row["v1_parity_max_abs"] < 1e-4
    table = (out / "loop.md").read_text()
    assert all(f"\n| {day} | " in table for day in range(1, DAYS + 1)) and "\n| all | " in table
