"""The learning loop end to end (real Triton, the real gateway, its SQLite store): v1 trained on population A, population B streamed through Observe, `routerkt retrain` publishes v2 and puts it in canary, B's answers flow, the sequential test promotes v2; 0 failed calls throughout."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time

import grpc
import httpx
import pytest

from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.core.catalog import ModelCatalog
from serving.metrics import Metrics
from serving.server import ThreadedGateway
from serving.sessions.factory import open_store
from serving.sessions.keys import LearnerKeys
from serving.settings import Settings
from tests.conftest import TINY_OVERRIDES

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

KEYS = LearnerKeys(b"learning-loop-e2e-secret-32-byte")
STREAMED, FRESH = 200, 200            # population B: learners streamed before the retrain, then fresh ones
BATCH = 64


def population_b():
    """Population B: another world (seed 11: other question difficulties, other skills per question) on v1's ids.
    The ids stay v1's so the new version's config.pbtxt is the served one: a vocabulary that grows changes it,
    and Triton 2.51 can crash reloading a changed config under load (docs/learning-loop.md, "Publishing");
    vocabulary growth is tested in tests/integration/test_retrain.py."""
    from training.data.synthetic import generate
    frame = generate(n_learners=STREAMED + FRESH, seed=11)
    return [[(int(r.question_id), int(r.skill_id), int(r.correct)) for r in rows.itertuples()]
            for _, rows in frame.groupby("user_id")]


class Calls:
    """Counts every call to the gateway and the failed ones."""

    def __init__(self) -> None:
        self.total = self.failed = 0
        self.lock = threading.Lock()

    def __call__(self, fn, *args, **kwargs):
        with self.lock:
            self.total += 1
        try:
            return fn(*args, **kwargs)
        except grpc.RpcError as exc:
            with self.lock:
                self.failed += 1
            print(f"failed call: {exc.code()} {exc.details()}")
            return None


def test_retrain_publishes_v2_in_canary_and_the_sequential_test_promotes_it(kt_repository, tmp_path) -> None:
    from serving.tritonserver.launcher import TritonServer
    repo = tmp_path / "repo"
    shutil.copytree(kt_repository.path, repo)
    policy, store = tmp_path / "rollout.json", tmp_path / "sessions.sqlite3"
    triton = TritonServer(repo, log_path=tmp_path / "triton.log", exit_timeout_s=3)
    triton.start(timeout=120)
    settings = Settings(repository=repo, triton_url=triton.grpc_url, grpc_port=0, http_port=0, probe_interval_s=0.5,
                        probe_timeout_s=10.0, grace_period_s=1.0, rollout_policy=policy, rollout_poll_s=0.1,
                        outcome_flush_s=0.02)
    metrics, catalog = Metrics(), ModelCatalog(repo)
    gw = ThreadedGateway(settings, metrics, catalog=catalog, store=open_store(f"sqlite:///{store}"), keys=KEYS).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}")
    stub = pb_grpc.KnowledgeTracingServiceStub(channel)
    http = f"http://127.0.0.1:{gw.http_port}"
    calls, stop = Calls(), threading.Event()
    try:
        deadline = time.monotonic() + 90
        while gw.server.backend.ready_versions("kt") != frozenset({1}):
            assert time.monotonic() < deadline, "version 1 never became ready"
            time.sleep(0.2)
        learners = population_b()
        for n, events in enumerate(learners[:STREAMED]):                 # B streams in: every answer Observed
            for start in range(0, len(events), 100):
                calls(stub.Observe, pb.ObserveRequest(learner_id=f"b-{n}", events=[
                    pb.Event(event_id=f"e{t}", question_id=q, skill_id=s, correct=c, timestamp_ms=1_000_000 + 1000 * t + n)
                    for t, (q, s, c) in enumerate(events[start:start + 100], start=start)]), timeout=10)

        def background() -> None:                                         # callers during the retrain
            n = 0
            while not stop.is_set():
                calls(stub.Predict, pb.PredictRequest(model="kt", learner_id=f"b-{n % STREAMED}",
                                                      candidates=[pb.Candidate(question_id=5)]), timeout=10)
                n += 1
                time.sleep(0.05)
        caller = threading.Thread(target=background)
        caller.start()
        done = subprocess.run([sys.executable, "-m", "routerkt.cli", "retrain", "--store", f"sqlite:///{store}",
                               "--repository", str(repo), "--model", "kt",
                               "--runs", str(kt_repository.run.parent), "--out", str(tmp_path / "retrain"),
                               "--gateway", http, "--weight", "0.5", "--epochs", "3",
                               *(f"--set={o}" for o in TINY_OVERRIDES if not o.startswith("data.window"))],
                              capture_output=True, text=True, timeout=900)
        stop.set()
        caller.join()
        assert done.returncode == 0, done.stderr[-2000:]
        entry = json.loads(policy.read_text())["models"]["kt"]
        assert (entry["policy"], entry["baseline"], entry["candidate"]) == ("canary", 1, 2)
        report = json.loads((tmp_path / "retrain" / "report.json").read_text())
        assert report["config"].startswith("kept")
        print(f"\n{done.stdout}")

        fresh = [(f"fresh-{n}", events, 0) for n, events in enumerate(learners[STREAMED:])]
        promoted, step = None, 0
        while promoted is None and any(step < len(events) for _, events, _ in fresh):
            active = [(learner, events[step]) for learner, events, _ in fresh if step < len(events)]
            for start in range(0, len(active), BATCH):                    # ask (routed by the canary), then answer
                batch = active[start:start + BATCH]
                calls(stub.PredictBatch, pb.PredictBatchRequest(model="kt", learners=[
                    pb.LearnerRequest(learner_id=learner, candidates=[pb.Candidate(question_id=q, skill_id=s)])
                    for learner, (q, s, _) in batch]), timeout=30)
                for learner, (q, s, c) in batch:
                    calls(stub.Observe, pb.ObserveRequest(learner_id=learner, events=[
                        pb.Event(event_id=f"e{step}", question_id=q, skill_id=s, correct=c)]), timeout=10)
            status = httpx.get(http + "/v1/rollout", timeout=5).json()
            if status["models"]["kt"]["policy"] == "pinned":
                promoted = status
            step += 1
        assert promoted is not None, f"never promoted: {httpx.get(http + '/v1/rollout', timeout=5).json()}"
        assert promoted["models"]["kt"]["version"] == 2
        for n in range(10):                                              # after: version 2 answers everyone
            response = calls(stub.Predict, pb.PredictRequest(model="kt", learner_id=f"after-{n}",
                                                             candidates=[pb.Candidate(question_id=150)]), timeout=10)
            assert response is not None and response.version == 2
        assert calls.failed == 0, f"{calls.failed} of {calls.total} calls failed"
        print(f"offline: served {report['served']}, new {report['candidate']}; promoted after {step} steps of "
              f"{len(fresh)} fresh learners ({calls.total} calls, 0 failed)")
    finally:
        stop.set()
        channel.close()
        gw.stop(grace=1.0)
        triton.stop()
