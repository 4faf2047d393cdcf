"""A real tritonserver (nvidia-pytriton's 2.51) serving a tiny ONNX model through our python backend.

The model is published with export/repository.py and export/triton_config.py, the server started
with serving/tritonserver/launcher.py; inference goes through tritonclient over gRPC on loopback.
"""
from __future__ import annotations

import os
import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from routerkt.contract import signature
from export.repository import list_versions, publish_version
from export.triton_python_model import PYTHON_MODEL_FILES
from export.triton_config import PARAM_N_QUESTIONS, PARAM_N_SKILLS, TritonModelOptions, render_config
from serving.tritonserver.launcher import STUB_NAME, TritonServer

pytestmark = pytest.mark.e2e

grpcclient = pytest.importorskip("tritonclient.grpc")
torch = pytest.importorskip("torch")

MODEL = "tiny-kt"
WINDOW = 20


def _publish(repo: Path, tiny, version: int | None = None) -> int:
    options = TritonModelOptions(
        window=WINDOW, max_batch_size=64, preferred_batch_sizes=[8], max_queue_delay_us=20_000,
        parameters={PARAM_N_QUESTIONS: str(tiny.n_questions), PARAM_N_SKILLS: str(tiny.n_skills),
                    "run_id": "e2e"})
    files = {signature.ONNX_FILE: tiny.onnx_path, **PYTHON_MODEL_FILES,
             signature.VOCAB_FILE: b"{}", signature.INFO_FILE: b'{"preset": "tiny"}'}
    return publish_version(repo, MODEL, files, render_config(MODEL, options), version=version)


@pytest.fixture(scope="module")
def served(tiny_kt_onnx, tmp_path_factory):
    repo = tmp_path_factory.mktemp("triton") / "model_repository"
    repo.mkdir()
    (repo / "README.md").write_text("generated; do not edit\n")   # like the committed one
    assert _publish(repo, tiny_kt_onnx) == 1
    server = TritonServer(repo, log_path=repo.parent / "triton.log", exit_timeout_s=5)
    server.start(timeout=60)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        yield server, client, tiny_kt_onnx, repo
    finally:
        client.close()
        assert server.stop() == 0
        assert not server.is_running()


def _batch(tiny, rows: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.integers(0, tiny.n_questions, (rows, WINDOW)), rng.integers(0, tiny.n_skills, (rows, WINDOW, 1)),
            rng.integers(-1, 2, (rows, WINDOW)))


def _inputs(arrays) -> list:
    inputs = []
    for spec, array in zip(signature.SCORE.inputs, arrays):
        tensor = grpcclient.InferInput(spec.name, list(array.shape), spec.onnx_dtype)
        tensor.set_data_from_numpy(np.ascontiguousarray(array, dtype=spec.dtype))
        inputs.append(tensor)
    return inputs


def _reference(tiny, arrays) -> np.ndarray:
    with torch.no_grad():
        return tiny.module(*(torch.from_numpy(np.asarray(a, dtype=np.int64)) for a in arrays)).numpy()


def test_server_and_model_are_ready_with_our_config(served) -> None:
    server, client, _, _ = served
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(MODEL, "1")
    config = client.get_model_config(MODEL).config
    assert config.backend == "python" and config.max_batch_size == 64
    assert [t.name for t in config.input] == list(signature.SCORE.input_names)
    assert config.parameters["run_id"].string_value == "e2e"
    stubs = server.stub_pids()
    assert stubs and all(STUB_NAME in Path(f"/proc/{pid}/cmdline").read_text() for pid in stubs)


def test_inference_matches_the_torch_module(served) -> None:
    _, client, tiny, _ = served
    arrays = _batch(tiny, rows=3, seed=1)
    result = client.infer(MODEL, _inputs(arrays), client_timeout=10.0)
    probs = result.as_numpy(signature.PROBS)
    assert probs.shape == (3, WINDOW) and probs.dtype == np.float32
    np.testing.assert_allclose(probs, _reference(tiny, arrays), atol=1e-5, rtol=0)


def test_one_bad_request_fails_alone_in_a_concurrent_batch(served) -> None:
    _, client, tiny, _ = served
    batches = [_batch(tiny, rows=1 + i % 2, seed=10 + i) for i in range(8)]
    bad = 5
    batches[bad][0][0, -1] = tiny.n_questions + 7          # out-of-range question id

    def call(arrays):
        try:
            return client.infer(MODEL, _inputs(arrays), client_timeout=10.0).as_numpy(signature.PROBS)
        except grpcclient.InferenceServerException as exc:
            return exc

    with ThreadPoolExecutor(max_workers=len(batches)) as pool:
        results = list(pool.map(call, batches))
    error = results[bad]
    assert isinstance(error, grpcclient.InferenceServerException)
    assert "INVALID_ARG" in str(error.status()) and "'questions'" in error.message()
    assert "Traceback" not in error.message() and "model.py" not in error.message()
    for i, (arrays, probs) in enumerate(zip(batches, results)):
        if i != bad:
            assert isinstance(probs, np.ndarray), f"request {i} failed: {probs}"
            np.testing.assert_allclose(probs, _reference(tiny, arrays), atol=1e-5, rtol=0)


def test_metrics_count_inferences_and_model_exec_time(served) -> None:
    server, client, tiny, _ = served
    client.infer(MODEL, _inputs(_batch(tiny, rows=2, seed=3)), client_timeout=10.0)
    with urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=5) as response:
        text = response.read().decode()
    count = re.search(r'^nv_inference_count\{model="tiny-kt",version="1"\} (\d+)', text, re.M)
    assert count and int(count.group(1)) >= 2
    histogram = re.search(r'^routerkt_triton_model_exec_seconds_count\{model="tiny-kt",version="1"\} (\d+)',
                          text, re.M)
    assert histogram and int(histogram.group(1)) >= 1


def test_a_new_version_is_served_next_to_the_previous_one(served) -> None:
    _, client, tiny, repo = served
    assert _publish(repo, tiny) == 2
    client.load_model(MODEL)                                 # explicit mode: pick up version 2
    assert client.is_model_ready(MODEL, "2") and client.is_model_ready(MODEL, "1")   # latest 2 served
    arrays = _batch(tiny, rows=1, seed=4)
    probs = client.infer(MODEL, _inputs(arrays), model_version="2", client_timeout=10.0).as_numpy(signature.PROBS)
    np.testing.assert_allclose(probs, _reference(tiny, arrays), atol=1e-5, rtol=0)
    assert list_versions(repo, MODEL) == [1, 2]
    assert (repo / "README.md").read_text() == "generated; do not edit\n"


def test_start_failure_raises_with_the_log_tail_and_stops_the_server(tiny_kt_onnx, tmp_path) -> None:
    repo = tmp_path / "repo"
    options = TritonModelOptions(window=WINDOW, parameters={PARAM_N_QUESTIONS: "5", PARAM_N_SKILLS: "5"})
    files = {signature.ONNX_FILE: b"this is not an onnx model", **PYTHON_MODEL_FILES}
    publish_version(repo, "broken", files, render_config("broken", options))
    server = TritonServer(repo, exit_timeout_s=2)
    with pytest.raises(RuntimeError, match="did not become ready") as info:
        server.start(timeout=60)
    assert "broken" in str(info.value)                    # the log tail names the failing model
    assert not server.is_running()


def test_kill_takes_down_the_server_its_stubs_and_their_shared_memory(served) -> None:
    """Without a private /dev/shm (a host that allows no mount namespace) the launcher removes the
    regions itself."""
    _, _, _, repo = served
    server = TritonServer(repo, exit_timeout_s=2, private_shm=False)
    server.start(timeout=60)
    try:
        stubs = server.stub_pids()
        assert stubs                                         # one per served version
        regions = {p for p in server._shm_seen if Path(p).exists()}
        assert regions
    finally:
        server.kill()
    assert not server.is_running()
    assert not any(_alive(pid) for pid in stubs)
    assert not any(Path(p).exists() for p in regions)


def test_the_shared_memory_is_private_to_the_server(served) -> None:
    """The default: the regions live in a tmpfs of mode 0700 mounted on the server's own /dev/shm,
    none in the host's; they go with the server."""
    _, _, _, repo = served
    server = TritonServer(repo, exit_timeout_s=2)
    assert server.private_shm, "this host allows a private mount namespace (unshare)"
    server.start(timeout=60)
    try:
        stubs = server.stub_pids()
        inside = [Path(f"/proc/{server.pid}/root{p}") for p in server._shm_seen]
        assert inside and all(p.exists() for p in inside)      # seen through the server's own root
        assert not any(Path(p).exists() for p in server._shm_seen)   # nothing in the host's /dev/shm
        assert os.stat(f"/proc/{server.pid}/root/dev/shm").st_mode & 0o777 == 0o700
    finally:
        server.kill()
    assert not any(_alive(pid) for pid in stubs)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
