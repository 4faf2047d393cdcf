"""The learning loop night after night (real Triton, the real gateway, its SQLite store, `routerkt retrain
--gateway` as the CronJob runs it): night 1 publishes v2 in canary; the canary stays undecided, so night 2
leaves it running (exit 3); night 3, past its patience, compares the new model with both canary versions
and canaries it over the better one; then `routerkt rollout rollback --gateway`. Callers run throughout:
0 failed calls, every version the policy names stays loaded, and the policy, the gateway's routing and
its weight metric agree after every night. A skill no version knew, Observed on day 2, reaches night 3's
vocabulary."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter

import grpc
import httpx
import pytest

from routerkt.contract.repository_reader import list_versions, read_vocab
from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.core.catalog import ModelCatalog
from serving.metrics import Metrics
from serving.server import ThreadedGateway
from serving.sessions.factory import open_store
from serving.sessions.keys import LearnerKeys
from serving.settings import Settings
from tests.conftest import TINY_OVERRIDES
from tests.e2e.test_learning_loop import Calls, population_b

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

KEYS = LearnerKeys(b"nightly-loop-e2e-secret-32-bytes")
NEW_SKILL, NEW_QUESTION = 9_001, 9_002          # ids no version knows, Observed on day 2
DAY_MS = 86_400_000


class Loop:
    """The gateway under test, its callers, and one night's retrain."""

    def __init__(self, stub, http: str, store, repo, runs, tmp_path) -> None:
        self.stub, self.http, self.store, self.repo, self.runs, self.tmp = stub, http, store, repo, runs, tmp_path
        self.calls = Calls()
        self.nights = 0

    def observe_day(self, learners: list[tuple[str, list]], day: int) -> None:
        for learner, events in learners:
            for start in range(0, len(events), 100):
                self.calls(self.stub.Observe, pb.ObserveRequest(learner_id=learner, events=[
                    pb.Event(event_id=f"d{day}-e{t}", question_id=q, skill_id=s, correct=c,
                             timestamp_ms=day * DAY_MS + 1000 * t)
                    for t, (q, s, c) in enumerate(events[start:start + 100], start=start)]), timeout=10)

    def ask_and_answer(self, learners: list[tuple[str, list]], steps: int, day: int) -> None:
        """Each learner asks (routed by the policy) and answers, `steps` times: outcomes for the canary's test."""
        for step in range(steps):
            for learner, events in learners:
                q, s, c = events[step % len(events)]
                self.calls(self.stub.Predict, pb.PredictRequest(model="kt", learner_id=learner, candidates=[
                    pb.Candidate(question_id=q, skill_id=s)]), timeout=10)
                self.calls(self.stub.Observe, pb.ObserveRequest(learner_id=learner, events=[
                    pb.Event(event_id=f"a{day}-{step}", question_id=q, skill_id=s, correct=c,
                             timestamp_ms=day * DAY_MS + 500_000 + step)]), timeout=10)

    def retrain(self, *extra: str) -> tuple[int, dict, str]:
        self.nights += 1
        out = self.tmp / f"night-{self.nights}"
        done = subprocess.run([sys.executable, "-m", "routerkt.cli", "retrain", "--store", f"sqlite:///{self.store}",
                               "--repository", str(self.repo), "--model", "kt", "--runs", str(self.runs),
                               "--out", str(out), "--gateway", self.http, "--weight", "0.5", "--epochs", "2",
                               "--margin", "0", *extra,
                               *(f"--set={o}" for o in TINY_OVERRIDES if not o.startswith("data.window"))],
                              capture_output=True, text=True, timeout=900)
        assert done.returncode in (0, 3), done.stderr[-3000:]
        print(f"\nnight {self.nights}: exit {done.returncode}\n{done.stdout}")
        return done.returncode, json.loads((out / "report.json").read_text()), done.stderr

    def state(self) -> dict:
        return httpx.get(self.http + "/v1/rollout", timeout=5).json()["models"]["kt"]

    def check_agreement(self) -> dict:
        """Every version the policy names is loaded; the weight metric is the routed share; the routing has no
        note (nothing differs from the policy); Predicts by learner land on the versions the policy names."""
        entry = self.state()
        named = {entry[f] for f in ("version", "baseline", "candidate") if f in entry}
        ready = set(httpx.get(self.http + "/readyz", timeout=5).json()["models"]["kt"])
        assert named <= ready, (named, ready)
        assert "note" not in entry["routing"], entry["routing"]
        metrics = httpx.get(self.http + "/metrics", timeout=5).text
        line = next(m for m in metrics.splitlines() if m.startswith('routerkt_rollout_weight{model="kt"}'))
        assert float(line.split()[-1]) == entry["routing"]["candidate_share"] == entry.get("weight", 0.0)
        answered = Counter(self.calls(self.stub.Predict, pb.PredictRequest(
            model="kt", learner_id=f"probe-{n}", candidates=[pb.Candidate(question_id=5)]), timeout=10).version
            for n in range(60))
        assert set(answered) == named, (answered, entry)       # a 0.5 canary: both versions answer someone
        return entry


def policy_of(entry: dict) -> dict:
    return {k: entry[k] for k in ("policy", "version", "baseline", "candidate", "weight") if k in entry}


def test_three_nights_with_undecided_canaries_then_a_rollback(kt_repository, tmp_path) -> None:
    from serving.tritonserver.launcher import TritonServer
    repo = tmp_path / "repo"
    shutil.copytree(kt_repository.path, repo)
    runs = tmp_path / "runs"
    shutil.copytree(kt_repository.run, runs / kt_repository.run.name)     # night 1 warm-starts from v1's run
    policy, store = tmp_path / "rollout.json", tmp_path / "sessions.sqlite3"
    triton = TritonServer(repo, log_path=tmp_path / "triton.log", exit_timeout_s=3)
    triton.start(timeout=120)
    settings = Settings(repository=repo, triton_url=triton.grpc_url, grpc_port=0, http_port=0, probe_interval_s=0.5,
                        probe_timeout_s=10.0, grace_period_s=1.0, rollout_policy=policy, rollout_poll_s=0.1,
                        outcome_flush_s=0.02, repository_poll_s=0.5)
    metrics, catalog = Metrics(), ModelCatalog(repo)
    gw = ThreadedGateway(settings, metrics, catalog=catalog, store=open_store(f"sqlite:///{store}"), keys=KEYS).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}")
    stub = pb_grpc.KnowledgeTracingServiceStub(channel)
    loop = Loop(stub, f"http://127.0.0.1:{gw.http_port}", store, repo, runs, tmp_path)
    stop = threading.Event()

    def background() -> None:                                   # a platform's callers, night and day
        n = 0
        while not stop.is_set():
            loop.calls(stub.Predict, pb.PredictRequest(model="kt", learner_id=f"b-{n % 60}",
                                                       candidates=[pb.Candidate(question_id=5)]), timeout=15)
            n += 1
            time.sleep(0.05)

    caller = threading.Thread(target=background)
    try:
        deadline = time.monotonic() + 90
        while gw.server.backend.ready_versions("kt") != frozenset({1}):
            assert time.monotonic() < deadline, "version 1 never became ready"
            time.sleep(0.2)
        caller.start()
        learners = [(f"b-{n}", events) for n, events in enumerate(population_b())]

        loop.observe_day(learners[:120], day=1)
        code, night1, _ = loop.retrain("--canary-patience", "100000")
        assert (code, night1["outcome"], night1["new_version"]) == (0, "published", 2)
        entry = loop.check_agreement()
        assert (entry["policy"], entry["baseline"], entry["candidate"]) == ("canary", 1, 2)

        day2 = [(learner, events + [(NEW_QUESTION, NEW_SKILL, 1), (NEW_QUESTION, NEW_SKILL, 0)])
                for learner, events in learners[120:200]]
        loop.observe_day(day2, day=2)                           # a new question with a new skill enters the store
        loop.ask_and_answer(learners[200:230], steps=3, day=2)  # ~90 outcomes: below min_outcomes, undecided
        code, night2, _ = loop.retrain("--canary-patience", "100000")
        assert (code, night2["outcome"]) == (3, "canary_undecided"), night2["decision"]
        assert night2["canary"]["outcomes"]["candidate"] > 0 and "export" not in night2["seconds"]
        assert policy_of(loop.check_agreement()) == policy_of(entry)     # left running, untouched

        code, night3, _ = loop.retrain("--canary-patience", "1")
        assert night3["canary"]["replace"] is True and set(night3["compared"]) == {"1", "2"}
        assert night3["vocab"]["new_skills"] >= 1 and night3["vocab"]["new_questions"] >= 1
        assert code == 3 or night3["config"].startswith("kept")         # a grown vocabulary keeps config.pbtxt
        better = min(night3["compared"], key=lambda v: night3["compared"][v]["log_loss"])
        entry = loop.check_agreement()
        if code == 0:                                            # v3 beat the better of 1 and 2
            assert (entry["policy"], entry["baseline"], entry["candidate"]) == ("canary", int(better), 3)
            assert "replaces canary 1->2" in entry.get("note", "")
            vocab = read_vocab(repo, "kt", 3)
            assert NEW_SKILL in vocab.skills and NEW_QUESTION in vocab.questions
        else:
            assert night3["outcome"] == "not_better" and entry["candidate"] == 2
        assert {1, 2} <= set(list_versions(repo, "kt"))          # the canary's versions were never pruned

        rolled = subprocess.run([sys.executable, "-m", "routerkt.cli", "rollout", "rollback", "kt", "--gateway",
                                 loop.http, "--json"], capture_output=True, text=True, timeout=120)
        assert rolled.returncode == 0, rolled.stderr
        pinned = json.loads(rolled.stdout)
        assert pinned["entry"]["policy"] == "pinned" and pinned["served"] == entry["baseline"]
        entry = loop.check_agreement()
        assert policy_of(entry) == {"policy": "pinned", "version": pinned["served"]}
        stop.set()
        caller.join()
        assert loop.calls.failed == 0, f"{loop.calls.failed} of {loop.calls.total} calls failed"
        print(f"{loop.calls.total} calls, 0 failed; nights: {night1['outcome']}, {night2['outcome']}, "
              f"{night3['outcome']}")
    finally:
        stop.set()
        if caller.is_alive():
            caller.join()
        channel.close()
        gw.stop(grace=1.0)
        triton.stop()
