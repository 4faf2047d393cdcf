"""The Triton python model (export/triton_python_model/model.py) over the tiny model exported with --step-graphs,
without Triton (the fake `triton_python_backend_utils` of tests/unit/test_triton_python_model.py): requests for
different graphs, candidate widths and skill-set widths in one `execute` (a dynamic batch) answer as each request
alone, one onnxruntime run per graph; a bad step request gets INVALID_ARG naming its input, alone."""
from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest
from google.protobuf import json_format

from export import triton_config
from export.triton_python_model import MODEL_PY
from routerkt.contract.repository_reader import latest_version
from routerkt.contract.step_signature import STEP_GRAPHS
from tests.unit.test_triton_python_model import _fake_pb_utils, _Request, _TritonError

pytestmark = pytest.mark.integration
pytest.importorskip("torch")
WINDOW = 20
GRAPHS = STEP_GRAPHS["attention"]


@pytest.fixture(scope="module")
def model(kt_step_repository):
    patch = pytest.MonkeyPatch()
    patch.setitem(sys.modules, "triton_python_backend_utils", _fake_pb_utils())
    patch.syspath_prepend(str(MODEL_PY.parent))              # the stub puts the version folder on sys.path
    spec = importlib.util.spec_from_file_location("routerkt_test_step_model", MODEL_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    folder = kt_step_repository.path / "kt"
    config = triton_config.build_config("kt", triton_config.TritonModelOptions(
        graph="rank", explain=True, step_state="attention", window=WINDOW))
    instance = module.TritonPythonModel()
    text = json.dumps(json_format.MessageToDict(config, preserving_proto_field_name=True))
    instance.initialize({"model_config": text, "model_repository": str(folder), "model_name": "kt",
                         "model_version": str(latest_version(kt_step_repository.path, "kt"))})
    yield instance
    instance.finalize()
    patch.undo()


def _history(rows: int, k: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    kept = rng.integers(3, WINDOW - 1, rows)                    # left-padded: the first W - 1 - kept columns
    pad = np.arange(WINDOW - 1)[None, :] < (WINDOW - 1 - kept)[:, None]
    questions = np.where(pad, 0, rng.integers(2, 12, (rows, WINDOW - 1)))
    skills = np.where(pad[..., None], 0, rng.integers(2, 5, (rows, WINDOW - 1, k)))
    responses = np.where(pad, -1, rng.integers(0, 2, (rows, WINDOW - 1)))
    return {"history_questions": questions, "history_skills": skills, "history_responses": responses}


def _candidates(rows: int, n: int, k: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"candidate_questions": rng.integers(2, 12, (rows, n)), "candidate_skills": rng.integers(2, 5, (rows, n, k))}


def _outputs(response) -> dict[str, np.ndarray]:
    assert response.error is None, response.error and response.error.message()
    return {t.name(): t.as_numpy() for t in response.output_tensors}


def test_one_batch_of_every_graph_answers_as_each_request_alone(model) -> None:
    starts = [_history(2, 1, seed=1), _history(1, 3, seed=2)]
    states = [_outputs(r) for r in model.execute([_Request(a) for a in starts])]
    assert set(states[0]) == set(GRAPHS.start.output_names)
    for arrays, batched in zip(starts, states):
        alone = _outputs(model.execute([_Request(arrays)])[0])
        assert all(np.abs(alone[n] - batched[n]).max() <= 1e-6 for n in alone)

    rng = np.random.default_rng(3)
    appends = [{**s, "append_question": rng.integers(2, 12, (len(s["state_length"]), 1)),
                "append_skills": rng.integers(2, 5, (len(s["state_length"]), 1, k)),
                "append_response": rng.integers(0, 2, (len(s["state_length"]), 1))} for s, k in zip(states, (2, 1))]
    nexts = [{**s, **_candidates(len(s["state_length"]), n, k, seed=4 + n)} for s, n, k in zip(states, (3, 7), (1, 2))]
    ranks = [{**h, **_candidates(len(h["history_questions"]), n, h["history_skills"].shape[2], seed=9)}
             for h, n in zip(starts, (5, 2))]
    requests = [_Request(a) for a in appends + nexts + ranks]
    runs = len(model.exec_seconds.observed)
    responses = model.execute(requests)
    assert len(model.exec_seconds.observed) - runs == 3          # step_append, step_next, rank: one run each
    for request, response in zip(requests, responses):
        alone = _outputs(model.execute([_Request(request.arrays)])[0])
        batched = _outputs(response)
        assert set(alone) == set(batched) and all(np.abs(alone[n] - batched[n]).max() <= 1e-6 for n in alone)
    assert set(_outputs(responses[0])) == set(GRAPHS.append.output_names)
    assert _outputs(responses[3])["candidate_probs"].shape == (1, 7)
    # step_next after step_start answers as the rank graph on the same history and candidates
    rank_probs = _outputs(model.execute([_Request({**starts[0], **_candidates(2, 3, 1, seed=7)})])[0])
    np.testing.assert_allclose(_outputs(responses[2])["candidate_probs"], rank_probs["candidate_probs"], atol=1e-5)


def test_a_bad_step_request_fails_alone_naming_its_input(model) -> None:
    state = _outputs(model.execute([_Request(_history(1, 1, seed=5))])[0])
    good = {**state, **_candidates(1, 2, 1, seed=6)}
    bad = {
        "state_keys": {**good, "state_keys": good["state_keys"][..., :3]},
        "candidate_questions": {**good, "candidate_questions": np.full((1, 2), 10 ** 6)},
        "state_length": {**good, "state_length": np.array([WINDOW])},
        "append_response": {**state, "append_question": np.array([[2]]), "append_skills": np.array([[[2]]]),
                            "append_response": np.array([[3]])},
        "state_sums": {k: v for k, v in good.items() if k != "state_sums"},
    }
    responses = model.execute([_Request(good)] + [_Request(a) for a in bad.values()])
    assert responses[0].error is None
    for name, response in zip(bad, responses[1:]):
        assert response.error.code() == _TritonError.INVALID_ARG and name in response.error.message(), name


def _appended(rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"append_question": rng.integers(2, 12, (rows, 1)), "append_skills": rng.integers(2, 5, (rows, 1, 1)),
            "append_response": rng.integers(0, 2, (rows, 1))}


def test_held_states_answer_as_the_state_sent_and_a_key_not_held_is_not_found(model) -> None:
    """held_start / held_append / held_next (step_signature.py's held states) against the same graphs with the
    state sent: the same probabilities; a released, unknown or wrong-length key answers NOT_FOUND."""
    history, append, candidates = _history(2, 1, seed=11), _appended(2, seed=12), _candidates(2, 4, 1, seed=13)
    sent = _outputs(model.execute([_Request(history)])[0])
    sent = {n[len("updated_"):]: a for n, a in _outputs(model.execute([_Request({**sent, **append})])[0]).items()}
    want = _outputs(model.execute([_Request({**sent, **candidates})])[0])["candidate_probs"]

    first, second = np.array([101 << 8, 202 << 8]), np.array([303 << 8, 404 << 8])
    kept = _outputs(model.execute([_Request({**history, "keep_as": first})])[0])
    assert set(kept) == {"state_length"}
    moved = _outputs(model.execute([_Request({"state_length": kept["state_length"], "state_ref": first, **append,
                                              "keep_as": second})])[0])
    assert set(moved) == {"updated_state_length"}
    np.testing.assert_array_equal(moved["updated_state_length"], sent["state_length"])
    got = _outputs(model.execute([_Request({"state_length": moved["updated_state_length"], "state_ref": second,
                                            **candidates})])[0])["candidate_probs"]
    np.testing.assert_allclose(got, want, atol=1e-6)

    assert set(list(model.held.states)[:2]) == set(first.tolist())   # replaced by the append: the first evicted
    length = moved["updated_state_length"]
    for refs, lengths in ((np.array([999 << 8, second[1]]), length), (second, length + 1)):
        response = model.execute([_Request({"state_length": lengths, "state_ref": refs, **candidates})])[0]
        assert response.error.code() == _TritonError.NOT_FOUND and "state not held" in response.error.message()

    dropped = _outputs(model.execute([_Request({"state_ref": np.array([second[0], 999 << 8])})])[0])   # ForgetLearner
    np.testing.assert_array_equal(dropped["state_length"], [length[0], -1])
    response = model.execute([_Request({"state_length": length, "state_ref": second, **candidates})])[0]
    assert response.error.code() == _TritonError.NOT_FOUND


def test_held_states_stay_within_their_budget_least_recently_used_out_first(model, monkeypatch) -> None:
    history = _history(1, 1, seed=21)
    size = sum(a.nbytes for a in _outputs(model.execute([_Request(history)])[0]).values())
    monkeypatch.setattr(model.held, "budget", 2 * size)
    for key in (1, 2, 3):
        model.execute([_Request({**history, "keep_as": np.array([key << 8])})])
    assert (1 << 8) not in model.held.states and {2 << 8, 3 << 8} <= set(model.held.states)
    assert model.held.nbytes <= 2 * size
    states, nbytes = model.held_gauges[1:]                                    # the Triton metrics
    assert (states.value, nbytes.value) == (len(model.held.states), model.held.nbytes)
    model.execute([_Request({**history, "keep_as": np.array([2 << 8])})])      # a key kept twice: a clash
    assert (2 << 8) not in model.held.states
