"""`routerkt sessions import`: a canonical CSV into a real SQLite store, in order, idempotent, and
malformed files rejected by line before anything is written."""
from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from serving.sessions.keys import LearnerKeys, load_secret
from serving.sessions.factory import open_store

pytestmark = pytest.mark.integration

ROUTERKT = Path(sys.executable).with_name("routerkt")
CSV = "user_id,order,question_id,skill_id,correct\n7,2,30,5,1\n7,0,10,5,0\n9,0,11,-1,1\n7,1,20,6,1\n"


def run_import(tmp_path: Path, data: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROUTERKT), "sessions", "import", "--data", str(data), "--store",
                           f"sqlite:///{tmp_path / 's.sqlite3'}", "--secret-file", str(tmp_path / "secret")],
                          capture_output=True, text=True, timeout=120)


def history(tmp_path: Path, learner: str) -> list[int]:
    async def read():
        store = open_store(f"sqlite:///{tmp_path / 's.sqlite3'}")
        await store.open()
        try:
            key = LearnerKeys(load_secret(tmp_path / "secret", create=False)).learner(learner)
            return (await store.history(key, 100)).questions.tolist()
        finally:
            await store.close()
    return asyncio.run(read())


def test_import_orders_by_order_and_is_idempotent(tmp_path: Path) -> None:
    data = tmp_path / "interactions.csv"
    data.write_text(CSV)
    first = run_import(tmp_path, data)
    assert first.returncode == 0, first.stderr
    assert "2 learners: 4 events stored, 0 already there" in first.stdout and "events/s" in first.stdout
    assert history(tmp_path, "7") == [10, 20, 30] and history(tmp_path, "9") == [11]
    again = run_import(tmp_path, data)
    assert "0 events stored, 4 already there" in again.stdout


def test_a_malformed_file_is_one_line_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    data = tmp_path / "bad.csv"
    data.write_text(CSV + "9,1,12,3,2\n")
    proc = run_import(tmp_path, data)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "bad.csv:6:" in proc.stderr and "correct" in proc.stderr
    assert not (tmp_path / "s.sqlite3").exists()
