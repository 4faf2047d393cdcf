"""The learner-state path through a real tritonserver: the tiny model exported with --step-graphs has a rank
model whose config.pbtxt declares the step graphs too, and the gateway (Triton backend, real SQLite store) sends
each learner's cached state with its step requests. Every Predict by learner_id answers as the same history sent
explicitly (<= 1e-5) on every path (tests/integration/test_learner_states.py walks them); bad step requests sent
straight to Triton get INVALID_ARG naming the input, and a plain rank request still answers. A band model's
learner past its band is served from its rolling state through Triton too."""
from __future__ import annotations

import time

import grpc
import numpy as np
import pytest

from routerkt.contract.repository_reader import latest_version, read_vocab
from routerkt.contract.step_signature import STEP_GRAPHS
from serving.api import knowledge_tracing_pb2 as pb
from tests.e2e.conftest import triton_over
from tests.integration.test_band_serving import walk_past_the_band
from tests.integration.test_learner_states import Served, walk_every_path

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def triton_steps(kt_step_repository, tmp_path_factory):
    with triton_over(kt_step_repository.path, tmp_path_factory.mktemp("triton-steps")) as server:
        yield kt_step_repository.path, server


def _ready(served: Served) -> None:
    for _ in range(240):
        try:
            served.stub.Predict(pb.PredictRequest(model="kt", candidates=[pb.Candidate(question_id=1)]), timeout=5)
            return
        except grpc.RpcError:
            time.sleep(0.25)
    raise AssertionError("the gateway over Triton never answered")


def test_predict_by_learner_id_through_triton_answers_as_the_explicit_history(triton_steps, tmp_path) -> None:
    repository, server = triton_steps
    vocab = read_vocab(repository, "kt", latest_version(repository, "kt"))
    questions = [q for q, skills in sorted(vocab.question_skills.items()) if all(s in vocab.skills for s in skills)]
    served = Served(repository, tmp_path / "sessions.sqlite3", triton_url=server.grpc_url)
    try:
        _ready(served)
        walk_every_path(served, questions, sorted(vocab.skills))
    finally:
        served.close()


def test_a_band_model_through_triton_answers_from_its_rolling_state(kt_band_repository, tmp_path) -> None:
    """The band model's step graphs in Triton (state_length past W - 1 accepted): the walk of
    tests/integration/test_band_serving.py, equal to PyTorch over the whole history."""
    with triton_over(kt_band_repository.path, tmp_path) as server:
        served = Served(kt_band_repository.path, tmp_path / "sessions.sqlite3", triton_url=server.grpc_url)
        try:
            _ready(served)
            walk_past_the_band(served, kt_band_repository)
        finally:
            served.close()


def test_triton_checks_step_requests_and_still_serves_the_rank_graph(triton_steps) -> None:
    import tritonclient.grpc as tc
    repository, server = triton_steps
    client = tc.InferenceServerClient(server.grpc_url.removeprefix("grpc://"))
    start = STEP_GRAPHS["attention"].start

    def infer(arrays: dict[str, np.ndarray], outputs):
        inputs = []
        for name, array in arrays.items():
            inputs.append(tc.InferInput(name, list(array.shape), "INT64" if array.dtype == np.int64 else "FP32"))
            inputs[-1].set_data_from_numpy(array)
        return client.infer("kt", inputs, outputs=[tc.InferRequestedOutput(n) for n in outputs])

    history = {"history_questions": np.zeros((2, 19), np.int64), "history_skills": np.zeros((2, 19, 1), np.int64),
               "history_responses": np.full((2, 19), -1, np.int64)}
    state = infer(history, start.output_names)
    length = state.as_numpy("state_length")
    assert length.shape == (2, 1) and (length == 0).all()
    bad = dict(history, history_questions=np.full((2, 19), 10 ** 6, np.int64))
    with pytest.raises(tc.InferenceServerException, match="history_questions"):
        infer(bad, start.output_names)
    next_graph = STEP_GRAPHS["attention"].next
    feeds = {name: state.as_numpy(name) for name in start.output_names}
    feeds.update(candidate_questions=np.ones((2, 3), np.int64), candidate_skills=np.ones((2, 3, 1), np.int64))
    probs = infer(feeds, next_graph.output_names).as_numpy("candidate_probs")
    assert probs.shape == (2, 3) and ((probs > 0) & (probs < 1)).all()
    rank = infer({**history, "candidate_questions": feeds["candidate_questions"],
                  "candidate_skills": feeds["candidate_skills"]}, ("candidate_probs",)).as_numpy("candidate_probs")
    assert np.abs(rank - probs).max() <= 1e-5
    with pytest.raises(tc.InferenceServerException, match="state_keys"):
        infer(dict(feeds, state_keys=feeds["state_keys"][:, :, :, :5]), next_graph.output_names)
