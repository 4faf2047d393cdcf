"""Protobuf -> arrays at the gRPC edge (serving/transport/grpc_api.py): every field read in one pass, skill
ids kept apart as set / not set / -1 / invalid, empty lists, the size that decides whether a
PredictBatch is converted in a worker thread, and HistoryColumns (the same arrays as the message
form; columns of different lengths or both forms at once refused, naming the field)."""
from __future__ import annotations

import grpc
import numpy as np
import pytest

from serving.api import knowledge_tracing_pb2 as pb
from serving.status_errors import ServingError
from serving.transport.grpc_api import (OFFLOAD_INTERACTIONS, batch_query, interactions_in, learner_query, predict_query,
                              recommend_query)
from serving.core.calls import ABSENT_SKILL, INVALID_SKILL

pytestmark = pytest.mark.unit


def test_fields_and_skill_states():
    history = [pb.Interaction(question_id=7, correct=1), pb.Interaction(question_id=8, skill_id=3, correct=0),
               pb.Interaction(question_id=9, skill_id=-1, correct=1), pb.Interaction(question_id=10, skill_id=-5)]
    candidates = [pb.Candidate(question_id=11), pb.Candidate(question_id=12, skill_id=0)]
    q = learner_query(history, candidates, learner_id="x")
    assert q.history_questions.tolist() == [7, 8, 9, 10]
    assert q.history_skills.tolist() == [[ABSENT_SKILL], [3], [-1], [INVALID_SKILL]]      # sets of one: [H, 1]
    assert q.history_correct.tolist() == [1, 0, 1, 0]
    assert q.candidate_questions.tolist() == [11, 12] and q.candidate_skills.tolist() == [[ABSENT_SKILL], [0]]
    assert all(a.dtype == np.int64 and a.flags["C_CONTIGUOUS"] for a in
               (q.history_questions, q.history_skills, q.history_correct, q.candidate_questions, q.candidate_skills))
    assert q.learner_id == "x"


def test_empty_lists_give_empty_arrays():
    q = learner_query([], [])
    assert [a.shape for a in (q.history_questions, q.history_skills, q.history_correct,
                              q.candidate_questions, q.candidate_skills)] == [(0,), (0, 1), (0,), (0,), (0, 1)]


def test_batch_size_counts_history_and_candidates():
    learner = pb.LearnerRequest(history=[pb.Interaction(question_id=2)] * 3, candidates=[pb.Candidate(question_id=2)])
    request = pb.PredictBatchRequest(model="m", learners=[learner, learner])
    assert interactions_in(request) == 8 < OFFLOAD_INTERACTIONS
    assert [len(x.history_questions) for x in batch_query(request).learners] == [3, 3]


def _messages_and_columns(n: int, with_skills: bool):
    skills = [-5, -1, *range(n - 2)]                    # invalid, unknown, then known ids
    history = [pb.Interaction(question_id=5 + i, correct=i % 2, **({"skill_id": skills[i]} if with_skills else {}))
               for i in range(n)]
    columns = pb.HistoryColumns(question_ids=[5 + i for i in range(n)], correct=[i % 2 for i in range(n)],
                                skill_ids=skills if with_skills else [])
    return history, columns


@pytest.mark.parametrize("with_skills", [False, True])
def test_history_columns_equal_the_same_history_as_messages(with_skills):
    history, columns = _messages_and_columns(6, with_skills)
    candidates = [pb.Candidate(question_id=3)]
    a = predict_query(pb.PredictRequest(model="m", history=history, candidates=candidates)).learners[0]
    b = predict_query(pb.PredictRequest(model="m", history_columns=columns, candidates=candidates)).learners[0]
    for name in ("history_questions", "history_skills", "history_correct", "candidate_questions", "candidate_skills"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype == np.int64 and x.tolist() == y.tolist(), name
    # skill states as in the message form: -1 stays "unknown", below -1 is marked invalid, none = absent
    assert b.history_skills[:, 0].tolist() == ([INVALID_SKILL, -1, 0, 1, 2, 3] if with_skills else [ABSENT_SKILL] * 6)


def test_history_columns_in_a_batch_and_in_recommend():
    _, columns = _messages_and_columns(4, True)
    request = pb.PredictBatchRequest(model="m", learners=[
        pb.LearnerRequest(history_columns=columns, candidates=[pb.Candidate(question_id=1)]),
        pb.LearnerRequest(history=[pb.Interaction(question_id=9)], candidates=[pb.Candidate(question_id=1)])])
    assert [x.history_questions.tolist() for x in batch_query(request).learners] == [[5, 6, 7, 8], [9]]
    assert interactions_in(request) == 4 + 1 + 2
    rec = recommend_query(pb.RecommendRequest(model="m", history_columns=columns, candidates=[pb.Candidate(question_id=1)]))
    assert rec.learner.history_correct.tolist() == [0, 1, 0, 1]


@pytest.mark.parametrize("columns, field", [
    (pb.HistoryColumns(question_ids=[1, 2], correct=[1]), "history_columns.correct"),
    (pb.HistoryColumns(question_ids=[1, 2], correct=[1, 0], skill_ids=[3]), "history_columns.skill_ids"),
    (pb.HistoryColumns(question_ids=[], correct=[1]), "history_columns.correct"),
])
def test_history_columns_of_different_lengths_name_the_column(columns, field):
    with pytest.raises(ServingError) as caught:
        predict_query(pb.PredictRequest(model="m", history_columns=columns, candidates=[pb.Candidate(question_id=1)]))
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT and caught.value.field == field
    batch = pb.PredictBatchRequest(model="m", learners=[pb.LearnerRequest(candidates=[pb.Candidate(question_id=1)]),
                                                        pb.LearnerRequest(history_columns=columns)])
    with pytest.raises(ServingError) as caught:
        batch_query(batch)
    assert caught.value.field == f"learners[1].{field}"


def test_history_and_history_columns_together_are_refused():
    with pytest.raises(ServingError) as caught:
        predict_query(pb.PredictRequest(model="m", history=[pb.Interaction(question_id=1)],
                                        history_columns=pb.HistoryColumns(question_ids=[1], correct=[1])))
    assert caught.value.field == "history_columns" and "not both" in caught.value.message


def test_empty_history_columns_are_a_cold_start():
    q = predict_query(pb.PredictRequest(model="m", history_columns=pb.HistoryColumns(),
                                        candidates=[pb.Candidate(question_id=1)])).learners[0]
    assert q.history_questions.shape == q.history_correct.shape == (0,) and q.history_skills.shape == (0, 1)
