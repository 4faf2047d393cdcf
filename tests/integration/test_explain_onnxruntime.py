"""`explain` through the in-process onnxruntime backend (`routerkt serve --backend onnxruntime`) behind
real gRPC, over the tiny exported routerkt-akt (version 1, with explain.onnx) and its copy without
the explain graph (version 2; both from tests/e2e/test_explain.py): the explain graph's attention
and head weights equal the PyTorch model's within 1e-5 as through Triton, its probabilities the rank
graph's, and version 2 still predicts but answers explain with FAILED_PRECONDITION naming model and version."""
from __future__ import annotations

import grpc
import numpy as np
import pytest

from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.backends.onnxruntime import OnnxRuntimeBackend
from serving.metrics import Metrics
from serving.server import ThreadedGateway
from serving.settings import Settings
from tests.e2e.test_explain import (WINDOW, history, interactions, plain_and_explained,  # noqa: F401 (fixtures)
                                    repository, torch_reference)
from tests.integration.test_gateway_onnxruntime import checkpoint  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stub(repository):  # noqa: F811 (the imported fixture)
    settings = Settings(repository=repository, grpc_port=0, http_port=None, probe_interval_s=0.5, grace_period_s=1.0)
    backend = OnnxRuntimeBackend(settings)
    gw = ThreadedGateway(settings, Metrics(), backend=backend).start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}") as channel:
            yield pb_grpc.KnowledgeTracingServiceStub(channel)
    finally:
        gw.stop(grace=1.0)


def test_explain_answers_the_pytorch_attention(stub, checkpoint, history) -> None:  # noqa: F811
    candidates = sorted(checkpoint.vocab.questions)[:3]
    plain, answer = plain_and_explained(stub, history, candidates)          # every interaction the model saw
    np.testing.assert_allclose(answer.probabilities, plain.probabilities, atol=1e-5, rtol=0)
    attention, weights = torch_reference(checkpoint, history, candidates)
    first = len(history) - (WINDOW - 1)
    assert len(answer.explanations) == len(candidates)
    for served_weights, explanation, expected in zip(weights, answer.explanations, attention):
        served = np.full_like(expected, np.nan)                 # [heads, window - 1]
        for a in explanation.attended:
            served[:, a.position - first] = a.head_attention
        np.testing.assert_allclose(served, expected, atol=1e-5, rtol=0)
        np.testing.assert_allclose(explanation.head_weights, served_weights, atol=1e-5, rtol=0)


def test_a_version_without_explain_onnx_is_a_failed_precondition(stub, history) -> None:  # noqa: F811
    request = pb.PredictRequest(model="kt", version=2, history=interactions(history),
                                candidates=[pb.Candidate(question_id=history[0][0])])
    assert len(stub.Predict(request, timeout=20).probabilities) == 1
    request.explain.top_k = 2
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(request, timeout=20)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "kt" in info.value.details() and "version 2" in info.value.details()
