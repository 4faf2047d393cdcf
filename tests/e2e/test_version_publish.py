"""A version published under load: the gateway moves `version: 0` calls to it by itself, and no
call fails meanwhile (Triton keeps serving the previous version until the new one answers), also
when the new version changes config.pbtxt (Triton reloads every version of the model: the
gateway drains the model first)."""
from __future__ import annotations

import shutil
import threading
import time

import grpc
import pytest

from export.repository import publish_version
from routerkt.contract.repository import read_served_shape, version_dir
from routerkt.contract.signature import CONFIG_FILE
from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.metrics import Metrics
from serving.server import ThreadedGateway
from serving.settings import Settings
from serving.tritonserver.launcher import TritonServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.parametrize("config_change", [False, True], ids=["same-config", "changed-config"])
def test_a_version_published_under_load_takes_over_without_a_failed_call(kt_repository, tmp_path,
                                                                          config_change) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(kt_repository.path, repo)
    assert read_served_shape(repo, "kt").max_batch_size >= 1
    triton = TritonServer(repo, log_path=tmp_path / "triton.log", exit_timeout_s=3)
    triton.start(timeout=120)
    settings = Settings(repository=repo, triton_url=triton.grpc_url, grpc_port=0, http_port=None,
                        probe_timeout_s=10.0, grace_period_s=1.0)
    metrics = Metrics()
    gw = ThreadedGateway(settings, metrics).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}")
    stub = pb_grpc.KnowledgeTracingServiceStub(channel)
    request = pb.PredictRequest(model="kt", candidates=[pb.Candidate(question_id=1)],
                                history=[pb.Interaction(question_id=1, correct=1)])
    versions: list[tuple[float, int]] = []
    failures: list[str] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                versions.append((time.monotonic(), stub.Predict(request, timeout=5.0).version))
            except grpc.RpcError as exc:
                failures.append(exc.code().name)
            time.sleep(0.02)
    try:
        deadline = time.monotonic() + 60
        while not gw.server.backend.ready_versions("kt") and time.monotonic() < deadline:
            time.sleep(0.2)
        callers = [threading.Thread(target=load) for _ in range(3)]
        for t in callers:
            t.start()
        time.sleep(1.0)
        source = version_dir(repo, "kt", 1)
        files = {p.name: p for p in source.iterdir() if p.is_file()}
        published = time.monotonic()
        config = (repo / "kt" / CONFIG_FILE).read_text()
        if config_change:               # as an export with other provenance or a grown vocabulary does
            config += 'parameters {\n  key: "published_by"\n  value { string_value: "test" }\n}\n'
        publish_version(repo, "kt", files, config, version=2)
        while time.monotonic() - published < 30 and not any(v == 2 for _, v in versions):
            time.sleep(0.1)
        time.sleep(1.0)
        alive = triton.is_running()
    finally:
        stop.set()
        for t in callers:
            t.join()
        channel.close()
        gw.stop(grace=1.0)
        triton.stop()
    assert alive, triton.log_tail()
    first_new = next((t for t, v in versions if v == 2), None)
    assert failures == []
    held = metrics.registry.get_sample_value("routerkt_model_reloads_total", {"model": "kt", "reason": "config_changed"})
    assert (held or 0.0) == (1.0 if config_change else 0.0)      # calls held (and unload first) only then
    assert first_new is not None, "version 2 was never used"
    print(f"version 2 first used {first_new - published:.2f} s after it was published")
    assert all(v == 2 for t, v in versions if t > first_new + 0.5)     # and it stays the one used
