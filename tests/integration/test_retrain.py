"""`routerkt retrain` on real SQLite stores and a tiny served version: the gate (exit 3, nothing published), the publish path (exit 0, v2 in canary), the lock and each fault (one line, exit 2, nothing half-written)."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest

from export.retrain_lock import retrain_lock
from routerkt.cli import main as routerkt_main
from routerkt.contract.repository import list_versions
from tests.conftest import TINY_OVERRIDES

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SECRET = b"test-secret-of-32-bytes-for-hmac!"


def fill(url: str, frame) -> None:
    from loadtest.bench_retrain import fill_store
    asyncio.run(fill_store(url, frame, SECRET))


@pytest.fixture(scope="module")
def stores(synthetic_csv, tmp_path_factory) -> dict[str, str]:
    """Population A (v1's own training data) and B (another world: other difficulties, 40 new questions)."""
    import pandas as pd
    from training.data.synthetic import generate
    folder = tmp_path_factory.mktemp("stores")
    urls = {"a": f"sqlite:///{folder / 'a.sqlite3'}", "b": f"sqlite:///{folder / 'b.sqlite3'}",
            "few": f"sqlite:///{folder / 'few.sqlite3'}", "empty": f"sqlite:///{folder / 'empty.sqlite3'}"}
    fill(urls["a"], pd.read_csv(synthetic_csv))
    fill(urls["b"], generate(n_learners=200, seed=11, n_questions=240))
    fill(urls["few"], generate(n_learners=3, seed=5, min_len=10, max_len=20))
    fill(urls["empty"], generate(n_learners=1, seed=5).iloc[:0])
    return urls


@pytest.fixture
def served(kt_repository, tmp_path) -> tuple[Path, Path]:
    """A copy of the tiny repository (v1 of model kt) and the policy file path (absent: latest)."""
    repo = tmp_path / "repo"
    shutil.copytree(kt_repository.path, repo)
    return repo, tmp_path / "rollout.json"


def retrain(store: str, repo: Path, policy: Path, kt_repository, tmp_path: Path, *extra: str) -> int:
    args = ["retrain", "--store", store, "--repository", str(repo), "--model", "kt", "--policy-file", str(policy),
            "--runs", str(kt_repository.run.parent), "--out", str(tmp_path / "retrain"), "--epochs", "2",
            *(f"--set={o}" for o in TINY_OVERRIDES if not o.startswith("data.window")), *extra]
    return routerkt_main(args)


def snapshot(repo: Path) -> list[str]:
    """Every file and folder of the repository but the retrain's lock file (it stays, naming the last holder)."""
    return sorted(str(p.relative_to(repo)) for p in repo.rglob("*")
                  if "__pycache__" not in p.parts and p.name != ".retrain.lock")


def test_gated_retrain_on_v1s_own_data_publishes_nothing(stores, served, kt_repository, tmp_path, capsys) -> None:
    repo, policy = served
    before = snapshot(repo)
    assert retrain(stores["a"], repo, policy, kt_repository, tmp_path, "--margin", "5") == 3
    out = capsys.readouterr().out
    assert "not better" in out and "served v1" in out
    assert snapshot(repo) == before and not policy.exists()
    report = json.loads((tmp_path / "retrain" / "report.json").read_text())
    assert report["decision"].startswith("not better") and report["new_version"] is None
    assert report["warm_start"]["copied"] > 0                         # v1's run was found and copied
    assert set(report["seconds"]) >= {"export", "split", "train", "evaluate"}
    assert not (tmp_path / "retrain" / "events.csv").exists()         # the platform's data is not left behind


def test_population_b_is_published_as_a_canary(stores, served, kt_repository, tmp_path, capsys) -> None:
    repo, policy = served
    assert retrain(stores["b"], repo, policy, kt_repository, tmp_path) == 0
    report = json.loads((tmp_path / "retrain" / "report.json").read_text())
    assert report["candidate"]["log_loss"] < report["served"]["log_loss"] - 0.002
    assert report["vocab"]["new_questions"] == 40 and report["config"].startswith("replaced")
    assert list_versions(repo, "kt") == [1, 2]
    entry = json.loads(policy.read_text())["models"]["kt"]
    assert (entry["policy"], entry["baseline"], entry["candidate"], entry["weight"]) == ("canary", 1, 2, 0.1)
    from routerkt.contract.repository import read_vocab
    assert len(read_vocab(repo, "kt", 2).questions) == 240
    assert "published version 2" in capsys.readouterr().out


def test_a_failure_after_publishing_takes_the_version_back(stores, served, kt_repository, tmp_path, capsys) -> None:
    repo, policy = served
    before = snapshot(repo)
    code = retrain(stores["b"], repo, policy, kt_repository, tmp_path, "--gateway", "http://127.0.0.1:1",
                   "--load-timeout", "1", "--epochs", "1")
    assert code == 2 and "did not report kt version 2 ready" in capsys.readouterr().err
    assert snapshot(repo) == before and not policy.exists()            # the pin before publishing is undone too


def test_one_retrain_at_a_time(served, kt_repository, tmp_path, capsys) -> None:
    repo, policy = served
    with retrain_lock(repo):
        assert retrain("sqlite:///unused.sqlite3", repo, policy, kt_repository, tmp_path) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"pid {os.getpid()} on host" in err[0] and "another retrain holds the lock" in err[0]


@pytest.mark.parametrize("case, message", [
    ("unreachable", "is not available"), ("empty", "the store holds no events"),
    ("few", "too few events for the split"), ("bad_flag", "--margin must be >= 0")])
def test_faults_are_one_line_and_leave_everything_as_it_was(case, message, stores, served, kt_repository, tmp_path,
                                                            capsys) -> None:
    repo, policy = served
    policy.write_text('{"format": 1, "models": {"kt": {"policy": "pinned", "version": 1}}}\n')
    before, policy_before = snapshot(repo), policy.read_bytes()
    store = {"unreachable": "redis://127.0.0.1:1/0", "bad_flag": stores["a"]}.get(case) or stores[case]
    extra = ["--margin", "-1"] if case == "bad_flag" else []
    assert retrain(store, repo, policy, kt_repository, tmp_path, *extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert snapshot(repo) == before and policy.read_bytes() == policy_before


def test_unwritable_repository_is_one_line(kt_repository, tmp_path, capsys) -> None:
    unwritable = Path("/sys/kernel")              # not writable even for root
    if not unwritable.is_dir():
        pytest.skip("needs /sys")
    assert retrain("sqlite:///unused.sqlite3", unwritable, tmp_path / "p.json", kt_repository, tmp_path) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not writable" in err[0]
