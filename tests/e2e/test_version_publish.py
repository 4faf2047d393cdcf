"""A version published under load: the gateway moves `version: 0` calls to it by itself, and no
call fails meanwhile (Triton keeps serving the previous version until the new one answers), also
when the new version changes config.pbtxt (Triton reloads every version of the model: the
gateway drains the model first). And the migration of a config that served the newest 2 versions
to one that serves every version folder: calls pinned to the oldest version fail none."""
from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import grpc
import pytest

from export.repository import publish_version
from routerkt.contract.repository_reader import read_served_shape, version_dir
from routerkt.contract.signature import CONFIG_FILE
from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.metrics import Metrics
from serving.server import ThreadedGateway
from serving.settings import Settings
from serving.tritonserver.launcher import TritonServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


LEGACY_POLICY = "version_policy {\n  latest {\n    num_versions: 2\n  }\n}\n"
ALL_POLICY = "version_policy {\n  all {\n  }\n}\n"


@dataclass
class Load:
    """3 callers sending `request` every 20 ms through the gateway: (time, version) per answer."""

    stub: pb_grpc.KnowledgeTracingServiceStub
    request: pb.PredictRequest
    versions: list[tuple[float, int]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.versions.append((time.monotonic(), self.stub.Predict(self.request, timeout=5.0).version))
            except grpc.RpcError as exc:
                self.failures.append(exc.code().name)
            time.sleep(0.02)

    @property
    def calls(self) -> int:
        return len(self.versions) + len(self.failures)


@dataclass
class Served:
    triton: TritonServer
    gateway: ThreadedGateway
    metrics: Metrics
    load: Load
    alive: bool = False

    def wait_ready(self, versions: set[int], timeout: float) -> frozenset[int]:
        deadline = time.monotonic() + timeout
        while self.gateway.server.backend.ready_versions("kt") != versions and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.gateway.server.backend.ready_versions("kt")

    def held(self) -> float:
        return self.metrics.registry.get_sample_value(
            "routerkt_model_reloads_total", {"model": "kt", "reason": "config_changed"}) or 0.0


@contextmanager
def served_under_load(repo, tmp_path, request: pb.PredictRequest, versions: set[int]) -> Iterator[Served]:
    """Triton and a gateway over `repo`; once `versions` are ready, 3 callers send `request` until the
    block ends (`alive`: Triton still running then)."""
    triton = TritonServer(repo, log_path=tmp_path / "triton.log", exit_timeout_s=3)
    triton.start(timeout=120)
    settings = Settings(repository=repo, triton_url=triton.grpc_url, grpc_port=0, http_port=None,
                        probe_timeout_s=10.0, grace_period_s=1.0)
    metrics = Metrics()
    gw = ThreadedGateway(settings, metrics).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}")
    served = Served(triton, gw, metrics, Load(pb_grpc.KnowledgeTracingServiceStub(channel), request))
    callers = [threading.Thread(target=served.load.run) for _ in range(3)]
    try:
        assert served.wait_ready(versions, 60) == versions
        for t in callers:
            t.start()
        time.sleep(1.0)
        yield served
        served.alive = triton.is_running()
    finally:
        served.load.stop.set()
        for t in callers:
            if t.is_alive():
                t.join()
        channel.close()
        gw.stop(grace=1.0)
        triton.stop()
    assert served.alive, triton.log_tail()


def _request(version: int = 0) -> pb.PredictRequest:
    return pb.PredictRequest(model="kt", version=version, candidates=[pb.Candidate(question_id=1)],
                             history=[pb.Interaction(question_id=1, correct=1)])


def _files(repo) -> dict:
    return {p.name: p for p in version_dir(repo, "kt", 1).iterdir() if p.is_file()}


@pytest.mark.parametrize("config_change", [False, True], ids=["same-config", "changed-config"])
def test_a_version_published_under_load_takes_over_without_a_failed_call(kt_repository, tmp_path,
                                                                          config_change) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(kt_repository.path, repo)
    assert read_served_shape(repo, "kt").max_batch_size >= 1
    with served_under_load(repo, tmp_path, _request(), {1}) as served:
        published = time.monotonic()
        config = (repo / "kt" / CONFIG_FILE).read_text()
        if config_change:               # as a version adding outputs (or the move from `latest` to `all`) does
            config += 'parameters {\n  key: "published_by"\n  value { string_value: "test" }\n}\n'
        publish_version(repo, "kt", _files(repo), config, version=2)
        versions = served.load.versions
        while time.monotonic() - published < 30 and not any(v == 2 for _, v in versions):
            time.sleep(0.1)
        time.sleep(1.0)
    first_new = next((t for t, v in versions if v == 2), None)
    assert served.load.failures == []
    assert served.held() == (1.0 if config_change else 0.0)       # calls held (and unload first) only then
    assert first_new is not None, "version 2 was never used"
    print(f"version 2 first used {first_new - published:.2f} s after it was published; "
          f"{served.load.calls} calls, {len(served.load.failures)} failed")
    assert all(v == 2 for t, v in versions if t > first_new + 0.5)     # and it stays the one used


def test_a_config_changing_publish_keeps_the_oldest_version_answering(kt_repository, tmp_path) -> None:
    """Issue 47's second night: versions 1 and 2 served under the former `latest: 2` policy, calls
    pinned to version 1 (a canary's baseline), version 3 published with today's config (`all`):
    Triton reloads every version, version 1 included, and no call fails."""
    repo = tmp_path / "repo"
    shutil.copytree(kt_repository.path, repo)
    config = (repo / "kt" / CONFIG_FILE).read_text()
    assert ALL_POLICY in config
    publish_version(repo, "kt", _files(repo), config.replace(ALL_POLICY, LEGACY_POLICY), version=2)
    with served_under_load(repo, tmp_path, _request(version=1), {1, 2}) as served:
        publish_version(repo, "kt", _files(repo), config, version=3)   # the config changes: latest 2 -> all
        served.wait_ready({1, 2, 3}, 30)
        time.sleep(1.0)
        ready = served.wait_ready({1, 2, 3}, 0)
    load = served.load
    print(f"{load.calls} calls on version 1, {len(load.failures)} failed; ready after: {sorted(ready)}")
    assert load.failures == []
    assert served.held() == 1.0 and ready == {1, 2, 3} and {v for _, v in load.versions} == {1}
