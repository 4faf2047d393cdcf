"""`routerkt retrain` on real SQLite stores and a tiny served version: the gate (exit 3, nothing published), the publish path (exit 0, v2 in canary), the next night's base after a canary, the lock and each fault (one line, exit 2, nothing half-written)."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from loop.retrain.lock import retrain_lock
from routerkt.cli import main as routerkt_main
from routerkt.contract.repository_reader import list_versions, read_vocab
from tests.conftest import TINY_OVERRIDES

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SECRET = b"test-secret-of-32-bytes-for-hmac!"


def fill(url: str, frame) -> None:
    from loadtest.bench.retrain import fill_store
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


def retrain(store: str, repo: Path, policy: Path | None, kt_repository, tmp_path: Path, *extra: str,
            runs: Path | None = None, out: Path | None = None) -> int:
    where = ["--policy-file", str(policy)] if policy is not None else []
    args = ["retrain", "--store", store, "--repository", str(repo), "--model", "kt", *where,
            "--runs", str(runs or kt_repository.run.parent), "--out", str(out or tmp_path / "retrain"),
            "--epochs", "2",
            *(f"--set={o}" for o in TINY_OVERRIDES if not o.startswith("data.window")), *extra]
    return routerkt_main(args)


def error_line(err: str) -> str:
    """The one error line a failed retrain prints after its progress lines (`[   1.2s] export...`)."""
    lines = err.strip().splitlines()
    assert "Traceback" not in err and all(line.startswith("[") for line in lines[:-1]), err
    return lines[-1]


def snapshot(repo: Path) -> list[str]:
    """Every file and folder of the repository but the retrain's lock file (it stays, naming the last holder)."""
    return sorted(str(p.relative_to(repo)) for p in repo.rglob("*")
                  if "__pycache__" not in p.parts and p.name != ".retrain.lock")


def test_gated_retrain_on_v1s_own_data_publishes_nothing(stores, served, kt_repository, tmp_path, capsys) -> None:
    repo, policy = served
    before = snapshot(repo)
    assert retrain(stores["a"], repo, policy, kt_repository, tmp_path, "--margin", "5") == 3
    out, err = capsys.readouterr()
    assert "not better" in out and "served v1" in out and "split at " in err
    assert snapshot(repo) == before and not policy.exists()
    report = json.loads((tmp_path / "retrain" / "report.json").read_text())
    assert report["decision"].startswith("not better") and report["new_version"] is None
    assert report["warm_start"]["copied"] > 0                         # v1's run was found and copied
    assert set(report["seconds"]) >= {"export", "split", "train", "evaluate"}
    assert report["outcome"] == "not_better" and report["cutoff"].endswith(" UTC")   # a plain date, not raw ms
    assert not (tmp_path / "retrain" / ".data").exists()              # the platform's data is not left behind


def test_kept_data_is_private_and_a_killed_retrains_data_is_swept(stores, served, kt_repository, tmp_path) -> None:
    repo, policy = served
    stale = kt_repository.run.parent / "retrain-killed" / ".data"          # what a kill -9 mid-run leaves
    stale.mkdir(parents=True)
    (stale / "train.csv").write_text("user_id,order,question_id,skill_id,correct\n")
    assert retrain(stores["a"], repo, policy, kt_repository, tmp_path, "--margin", "5", "--keep-data") == 3
    assert not stale.exists()
    data = tmp_path / "retrain" / ".data"
    assert (data.stat().st_mode & 0o777) == 0o700
    kept = {p.name: p.stat().st_mode & 0o777 for p in data.iterdir()}
    assert {"events.csv", "train.csv"} <= set(kept) and set(kept.values()) == {0o600}


def test_population_b_is_published_as_a_canary(stores, served, kt_repository, tmp_path, capsys) -> None:
    repo, policy = served
    assert retrain(stores["b"], repo, policy, kt_repository, tmp_path) == 0
    report = json.loads((tmp_path / "retrain" / "report.json").read_text())
    assert report["candidate"]["log_loss"] < report["served"]["log_loss"] - 0.002
    assert report["vocab"]["new_questions"] == 40 and report["config"].startswith("kept")   # bounds: model_info.json
    assert list_versions(repo, "kt") == [1, 2]
    entry = json.loads(policy.read_text())["models"]["kt"]
    assert (entry["policy"], entry["baseline"], entry["candidate"], entry["weight"]) == ("canary", 1, 2, 0.1)
    assert len(read_vocab(repo, "kt", 2).questions) == 240
    assert "published version 2" in capsys.readouterr().out


def test_a_band_models_retrain_trains_and_publishes_a_band_model(stores, kt_band_repository, tmp_path,
                                                                  capsys) -> None:
    """The served version is a band model (routerkt-akt's default): the retrain keeps its configuration, trains on
    whole histories (data.protocol=whole: the only protocol a band model accepts) and publishes a band model."""
    from routerkt.contract.repository_reader import read_model_info
    repo = tmp_path / "repo"
    shutil.copytree(kt_band_repository.path, repo)
    policy = tmp_path / "rollout.json"
    tiny = [o for o in TINY_OVERRIDES if not o.startswith(("data.window", "model.context"))]
    args = ["retrain", "--store", stores["b"], "--repository", str(repo), "--model", "kt", "--policy-file",
            str(policy), "--runs", str(kt_band_repository.run.parent), "--out", str(tmp_path / "retrain"),
            "--epochs", "1", *(f"--set={o}" for o in tiny)]
    started = time.time()
    assert routerkt_main(args) == 0, capsys.readouterr().err
    assert read_model_info(repo, "kt", 2).band
    written = [json.loads(p.read_text()) for folder in (tmp_path / "retrain", kt_band_repository.run.parent)
               for p in folder.rglob("config.json") if p.stat().st_mtime >= started - 1]
    assert written and all(c["data"]["protocol"] == "whole" and c["model"]["context"] == "band" for c in written)


def test_after_a_canary_the_next_retrain_starts_from_the_version_it_must_beat(stores, served, kt_repository,
                                                                              tmp_path) -> None:
    """Night 1 canaries v2 (trained on population B) over v1. Night 2, past the canary's patience, scores both on
    B's held-out events: v2 is the better, so the new model must beat v2, is warm-started from v2's run (not from
    the canary's baseline v1) and counts new ids against v2's vocabulary: the one question and one skill the
    store added since (v1 lacks 40 questions more)."""
    import httpx

    from routerkt.contract.repository_reader import read_model_info
    from serving.backends.onnxruntime import OnnxRuntimeBackend
    from serving.metrics import Metrics
    from serving.server import ThreadedGateway
    from serving.settings import Settings
    from training.data.synthetic import generate
    repo, policy = served
    runs = tmp_path / "runs"
    shutil.copytree(kt_repository.run, runs / kt_repository.run.name)          # night 1 warm-starts from v1's run
    assert retrain(stores["b"], repo, policy, kt_repository, tmp_path, "--epochs", "1", runs=runs,
                   out=runs / "night-1") == 0
    assert json.loads(policy.read_text())["models"]["kt"]["baseline"] == 1
    assert read_model_info(repo, "kt", 2).provenance["run_id"].startswith("night-1-")
    grown = generate(n_learners=200, seed=11, n_questions=240)                # B, its first learner's first two
    first = (grown["user_id"] == grown["user_id"].iloc[0]) & (grown["order"] < 2)   # answers on ids no version knows
    grown.loc[first, "question_id"], grown.loc[first, "skill_id"] = 9_002, 9_001
    store = f"sqlite:///{tmp_path / 'grown.sqlite3'}"
    fill(store, grown)
    settings = Settings(repository=repo, grpc_port=0, http_port=0, rollout_policy=policy, rollout_poll_s=0.1,
                        probe_interval_s=0.5, grace_period_s=1.0)
    gateway = ThreadedGateway(settings, Metrics(), backend=OnnxRuntimeBackend(settings)).start()
    url = f"http://127.0.0.1:{gateway.http_port}"
    try:
        deadline = time.monotonic() + 30                # the gateway counts the canary's outcomes (none yet)
        while "since_canary_began" not in httpx.get(url + "/v1/rollout", timeout=5).json()["models"].get("kt", {}):
            assert time.monotonic() < deadline, "the gateway never started counting the canary's outcomes"
            time.sleep(0.1)
        code = retrain(store, repo, None, kt_repository, tmp_path, "--gateway", url, "--canary-patience", "0",
                       "--margin", "10", "--epochs", "1", runs=runs, out=runs / "night-2")
    finally:
        gateway.stop(grace=1.0)
    report = json.loads((runs / "night-2" / "report.json").read_text())
    assert code == 3 and report["canary"]["replace"] is True and set(report["compared"]) == {"1", "2"}
    assert report["compared"]["2"]["log_loss"] < report["compared"]["1"]["log_loss"]    # v2 is the better offline
    assert report["warm_start"]["from"] == "night-1", report["warm_start"]             # v2's run, not v1's (tiny)
    assert (report["vocab"]["new_questions"], report["vocab"]["new_skills"]) == (1, 1), report["vocab"]
    assert report["vocab"] == {"against_version": 2, "new_questions": 1, "new_skills": 1, "questions": 241,
                               "skills": len(read_vocab(repo, "kt", 2).skills) + 1}
    assert report["warm_start"]["version"] == 2 and report["warm_start"]["row_mapped"] > 0   # 240 rows known, 1 new
    assert report["base_version"] == 2 and report["served"] == report["compared"]["2"]  # the gate's version
    assert "version 2's" in report["decision"]


def test_a_failure_after_publishing_takes_the_version_back(stores, served, kt_repository, tmp_path, capsys) -> None:
    """A real gateway serving a copy of v1's repository never sees v2: the load times out, v2 is taken back and
    the gateway's policy restored through its API (the pin retrain set before publishing is undone)."""
    from serving.backends.onnxruntime import OnnxRuntimeBackend
    from serving.metrics import Metrics
    from serving.server import ThreadedGateway
    from serving.settings import Settings
    repo, policy = served
    elsewhere = tmp_path / "gateway-repo"
    shutil.copytree(repo, elsewhere)
    settings = Settings(repository=elsewhere, grpc_port=0, http_port=0, rollout_policy=policy, rollout_poll_s=0.1,
                        probe_interval_s=0.5, grace_period_s=1.0)
    gateway = ThreadedGateway(settings, Metrics(), backend=OnnxRuntimeBackend(settings)).start()
    try:
        before = snapshot(repo)
        code = retrain(stores["b"], repo, None, kt_repository, tmp_path, "--gateway",
                       f"http://127.0.0.1:{gateway.http_port}", "--load-timeout", "1", "--epochs", "1")
        assert code == 2 and "did not report kt version 2 ready" in error_line(capsys.readouterr().err)
        assert snapshot(repo) == before
        assert json.loads(policy.read_text())["models"]["kt"] == {"policy": "latest"}    # the pin is undone
        assert gateway.server.policy.policy.get("kt").versions() == set()
    finally:
        gateway.stop(grace=1.0)


def test_gateway_and_policy_file_together_are_refused(served, kt_repository, tmp_path, capsys) -> None:
    repo, policy = served
    assert retrain("sqlite:///unused.sqlite3", repo, policy, kt_repository, tmp_path, "--gateway",
                   "http://127.0.0.1:1") == 2
    assert "--gateway and --policy-file" in capsys.readouterr().err


def test_a_canary_in_the_file_is_left_running_without_a_gateway(stores, served, kt_repository, tmp_path,
                                                               capsys) -> None:
    """Without --gateway the canary's outcomes cannot be read: it keeps running, nothing is exported or published."""
    repo, policy = served
    policy.write_text('{"format": 1, "models": {"kt": {"policy": "canary", "baseline": 1, "candidate": 2, '
                      '"weight": 0.1}}}\n')
    before, policy_before = snapshot(repo), policy.read_bytes()
    assert retrain(stores["b"], repo, policy, kt_repository, tmp_path) == 3
    report = json.loads((tmp_path / "retrain" / "report.json").read_text())
    assert report["outcome"] == "canary_undecided" and report["canary"]["replace"] is False
    assert "give --gateway" in capsys.readouterr().out
    assert "export" not in report["seconds"]
    assert snapshot(repo) == before and policy.read_bytes() == policy_before


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
    assert message in error_line(capsys.readouterr().err)
    assert snapshot(repo) == before and policy.read_bytes() == policy_before


def test_unwritable_repository_is_one_line(kt_repository, tmp_path, capsys) -> None:
    unwritable = Path("/sys/kernel")              # not writable even for root
    if not unwritable.is_dir():
        pytest.skip("needs /sys")
    assert retrain("sqlite:///unused.sqlite3", unwritable, tmp_path / "p.json", kt_repository, tmp_path) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not writable" in err[0]
