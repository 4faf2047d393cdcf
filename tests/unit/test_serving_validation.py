"""serving/core/validation.py, and serving/encoder/window.py's vocabulary mapping of what it lets through: every
bad input gets INVALID_ARGUMENT naming its field; good inputs become numpy arrays of raw ids; ids a
version does not know (questions and skills alike) map to the unknown id, counted, never an error."""
from __future__ import annotations

import grpc
import numpy as np
import pytest

from serving.status_errors import ServingError
from serving.encoder.window import encode_learner
from serving.api import knowledge_tracing_pb2 as pb
from serving.settings import Settings
from serving.transport.grpc_api import batch_query, predict_query
from serving.core.calls import ABSENT_SKILL, UNKNOWN_SKILL
from serving.core.validation import validate_query
from routerkt.contract.signature import UNK_ID
from routerkt.contract.vocab import Vocab

pytestmark = pytest.mark.unit


def validate_predict(request: pb.PredictRequest, settings: Settings):
    """A PredictRequest through the gRPC adapter's conversion and the structural validation."""
    return validate_query(predict_query(request), settings)[0]


def validate_batch(request: pb.PredictBatchRequest, settings: Settings):
    return validate_query(batch_query(request), settings)

SETTINGS = Settings(max_candidates=4, max_history=6, max_batch_learners=2).validate()
VOCAB = Vocab(questions={10: 2, 11: 3, 12: 4}, skills={5: 2, 6: 3}, question_skill={10: 5, 11: 6, 12: -1})


def interaction(q: int = 10, s: int | None = 5, c: int = 1) -> pb.Interaction:
    return pb.Interaction(question_id=q, correct=c, **({} if s is None else {"skill_id": s}))


def candidate(q: int = 11, s: int | None = None) -> pb.Candidate:
    return pb.Candidate(question_id=q, **({} if s is None else {"skill_id": s}))


def request(history=None, candidates=None, model: str = "kt", version: int = 0) -> pb.PredictRequest:
    return pb.PredictRequest(model=model, version=version,
                             history=[interaction()] if history is None else history,
                             candidates=[candidate()] if candidates is None else candidates)


def rejected(call) -> ServingError:
    with pytest.raises(ServingError) as info:
        call()
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
    return info.value


@pytest.mark.parametrize("req, field", [
    (request(model=""), "model"),
    (request(model="   "), "model"),
    (request(version=-1), "version"),
    (request(candidates=[]), "candidates"),
    (request(candidates=[candidate()] * 5), "candidates"),
    (request(history=[interaction()] * 7), "history"),
    (request(history=[interaction(), interaction(c=2)]), "history[1].correct"),
    (request(history=[interaction(c=-1)]), "history[0].correct"),
    (request(history=[interaction(), interaction(), interaction(q=-3)]), "history[2].question_id"),
    (request(history=[interaction(s=-2)]), "history[0].skill_id"),
    (request(history=[interaction(s=-(2**63))]), "history[0].skill_id"),
    (request(candidates=[candidate(), candidate(q=-1)]), "candidates[1].question_id"),
    (request(candidates=[candidate(s=-5)]), "candidates[0].skill_id"),
])
def test_bad_predict_requests_name_their_field(req: pb.PredictRequest, field: str) -> None:
    error = rejected(lambda: validate_predict(req, SETTINGS))
    assert error.field == field
    assert error.message.startswith(field + ": ")


def test_batch_limits_and_prefixed_fields() -> None:
    learner = pb.LearnerRequest(history=[interaction()], candidates=[candidate()])
    assert rejected(lambda: validate_batch(pb.PredictBatchRequest(model="kt"), SETTINGS)).field == "learners"
    too_many = pb.PredictBatchRequest(model="kt", learners=[learner] * 3)
    assert rejected(lambda: validate_batch(too_many, SETTINGS)).field == "learners"
    bad = pb.LearnerRequest(history=[interaction(), interaction(c=3)], candidates=[candidate()])
    error = rejected(lambda: validate_batch(pb.PredictBatchRequest(model="kt", learners=[learner, bad]), SETTINGS))
    assert error.field == "learners[1].history[1].correct"
    empty = pb.LearnerRequest(history=[interaction()])
    error = rejected(lambda: validate_batch(pb.PredictBatchRequest(model="kt", learners=[empty]), SETTINGS))
    assert error.field == "learners[0].candidates"
    assert rejected(lambda: validate_batch(pb.PredictBatchRequest(model="", learners=[learner]), SETTINGS)).field == "model"


def test_valid_request_becomes_raw_arrays_with_absent_and_unknown_skills() -> None:
    req = request(history=[interaction(10, 5, 1), interaction(11, None, 0), interaction(12, -1, 1)],
                  candidates=[candidate(10), candidate(12, 6)])
    learner = validate_predict(req, SETTINGS)
    np.testing.assert_array_equal(learner.history_questions, [10, 11, 12])
    np.testing.assert_array_equal(learner.history_skills, [[5], [ABSENT_SKILL], [UNKNOWN_SKILL]])
    np.testing.assert_array_equal(learner.history_correct, [1, 0, 1])
    np.testing.assert_array_equal(learner.candidate_questions, [10, 12])
    np.testing.assert_array_equal(learner.candidate_skills, [[ABSENT_SKILL], [6]])
    assert learner.history_length == 3 and learner.n_candidates == 2


def test_empty_history_is_a_valid_cold_start() -> None:
    learner = validate_predict(request(history=[]), SETTINGS)
    assert learner.history_length == 0


def test_skill_id_zero_is_a_real_id_not_absent() -> None:
    learner = validate_predict(request(history=[interaction(10, 0, 1)]), SETTINGS)
    assert learner.history_skills.tolist() == [[0]]


@pytest.mark.parametrize("history, candidates", [
    ([interaction(10, 5), interaction(11, 99)], [candidate()]),
    ([interaction()], [candidate(11, 6), candidate(11, 7)]),
])
def test_unknown_skill_ids_map_to_the_unknown_id_and_are_counted(history, candidates) -> None:
    counted: list[tuple[str, int]] = []
    learner = validate_predict(request(history=history, candidates=candidates), SETTINGS)
    encoded = encode_learner(learner, VOCAB, window=5, count_unknown=lambda k, n: counted.append((k, n)))
    assert counted == [("skill", 1)]
    assert int((encoded.skills == UNK_ID).sum() + (encoded.candidate_skills == UNK_ID).sum()) == 1


def test_unknown_skill_outside_the_window_is_neither_an_error_nor_counted() -> None:
    history = [interaction(10, 42)] + [interaction()] * 5         # window 3 uses only the last 2
    learner = validate_predict(request(history=history), SETTINGS)
    counted: list[tuple[str, int]] = []
    encoded = encode_learner(learner, VOCAB, window=3, count_unknown=lambda k, n: counted.append((k, n)))
    assert encoded.history_used == 2 and counted == []


def test_an_unknown_skill_of_a_batch_learner_is_the_unknown_id() -> None:
    ok = pb.LearnerRequest(history=[interaction()], candidates=[candidate()])
    new_skill = pb.LearnerRequest(history=[interaction()], candidates=[candidate(10, 77)])
    learners = validate_batch(pb.PredictBatchRequest(model="kt", learners=[ok, new_skill]), SETTINGS)
    assert encode_learner(learners[0], VOCAB, window=4).candidate_skills.tolist() == [[3]]
    assert encode_learner(learners[1], VOCAB, window=4).candidate_skills.tolist() == [[UNK_ID]]
