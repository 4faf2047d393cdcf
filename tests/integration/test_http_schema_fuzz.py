"""A property-based run of schemathesis against the HTTP mirror's own OpenAPI schema
(/openapi.json): every operation gets generated bodies, headers and values, valid and invalid.
The gateway runs for real on loopback (onnxruntime backend over the tiny exported model, a SQLite
session store, outcome tracking on). Promised: no 5xx (except /readyz's documented 503), no hang
(each call bounded), and afterwards the gateway is ready and answers a valid call correctly."""
from __future__ import annotations

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402

from serving.backends.onnxruntime import OnnxRuntimeBackend  # noqa: E402
from serving.core.catalog import ModelCatalog  # noqa: E402
from serving.metrics import Metrics  # noqa: E402
from serving.server import ThreadedGateway  # noqa: E402
from serving.sessions.keys import LearnerKeys  # noqa: E402
from serving.sessions.factory import open_store  # noqa: E402
from serving.settings import Settings  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CALL_TIMEOUT_S = 15.0
MAX_EXAMPLES = 40


@pytest.fixture(scope="module")
def fuzzed_gateway(kt_repository, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz")
    cfg = Settings(repository=kt_repository.path, grpc_port=0, http_port=0, probe_interval_s=0.5, grace_period_s=1.0,
                   rollout_policy=folder / "rollout.json")
    metrics, catalog = Metrics(), ModelCatalog(kt_repository.path)
    gw = ThreadedGateway(cfg, metrics, catalog=catalog, store=open_store(f"sqlite:///{folder / 's.sqlite3'}"),
                         keys=LearnerKeys(b"fuzz-secret-of-at-least-32-bytes"), backend=OnnxRuntimeBackend(cfg)).start()
    try:
        yield f"http://127.0.0.1:{gw.http_port}"
    finally:
        gw.stop(grace=1.0)


def check_response(case, response) -> None:
    if case.path == "/readyz" and case.method == "GET":
        assert response.status_code in (200, 503)          # 503: documented "not ready"
        return
    assert response.status_code < 500, (case.method, case.path, response.status_code, response.text[:300])
    if response.status_code >= 400:
        assert "error" in response.json(), (case.method, case.path, response.status_code, response.text[:300])
        error = response.json()["error"]                            # the documented error body
        assert error["code"] and error["message"]
        assert "Traceback" not in response.text and "serving." not in error["message"]


def test_no_generated_request_gets_a_server_error(fuzzed_gateway) -> None:
    """Every operation of the schema, MAX_EXAMPLES generated cases each (schemathesis strategies
    driven by hypothesis here, not through schemathesis' pytest plugin)."""
    schema = schemathesis.openapi.from_url(f"{fuzzed_gateway}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 8
    for operation in operations:
        @given(case=operation.as_strategy())
        @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
                  derandomize=True, database=None)
        def run(case) -> None:
            check_response(case, case.call(timeout=CALL_TIMEOUT_S))
        run()


def test_the_gateway_is_ready_and_correct_after_the_fuzzing(fuzzed_gateway, kt_repository) -> None:
    assert httpx.get(f"{fuzzed_gateway}/readyz", timeout=10).status_code == 200
    body = {"model": "kt", "history": [{"question_id": 1, "correct": 1}], "candidates": [{"question_id": 2}]}
    first = httpx.post(f"{fuzzed_gateway}/v1/predict", json=body, timeout=10).json()
    second = httpx.post(f"{fuzzed_gateway}/v1/predict", json=body, timeout=10).json()
    assert 0.0 < first["probabilities"][0] < 1.0 and first["probabilities"] == second["probabilities"]
