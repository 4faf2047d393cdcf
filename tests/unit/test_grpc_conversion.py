"""Protobuf -> arrays at the gRPC edge (serving/grpc_api.py): every field read in one pass, skill
ids kept apart as set / not set / -1 / invalid, empty lists, and the size that decides whether a
PredictBatch is converted in a worker thread."""
from __future__ import annotations

import numpy as np
import pytest

from serving.api import knowledge_tracing_pb2 as pb
from serving.grpc_api import OFFLOAD_INTERACTIONS, batch_query, interactions_in, learner_query
from serving.requests import ABSENT_SKILL, INVALID_SKILL

pytestmark = pytest.mark.unit


def test_fields_and_skill_states():
    history = [pb.Interaction(question_id=7, correct=1), pb.Interaction(question_id=8, skill_id=3, correct=0),
               pb.Interaction(question_id=9, skill_id=-1, correct=1), pb.Interaction(question_id=10, skill_id=-5)]
    candidates = [pb.Candidate(question_id=11), pb.Candidate(question_id=12, skill_id=0)]
    q = learner_query(history, candidates, learner_id="x")
    assert q.history_questions.tolist() == [7, 8, 9, 10]
    assert q.history_skills.tolist() == [ABSENT_SKILL, 3, -1, INVALID_SKILL]
    assert q.history_correct.tolist() == [1, 0, 1, 0]
    assert q.candidate_questions.tolist() == [11, 12] and q.candidate_skills.tolist() == [ABSENT_SKILL, 0]
    assert all(a.dtype == np.int64 and a.flags["C_CONTIGUOUS"] for a in
               (q.history_questions, q.history_skills, q.history_correct, q.candidate_questions, q.candidate_skills))
    assert q.learner_id == "x"


def test_empty_lists_give_empty_arrays():
    q = learner_query([], [])
    assert [a.shape for a in (q.history_questions, q.history_skills, q.history_correct,
                              q.candidate_questions, q.candidate_skills)] == [(0,)] * 5


def test_batch_size_counts_history_and_candidates():
    learner = pb.LearnerRequest(history=[pb.Interaction(question_id=2)] * 3, candidates=[pb.Candidate(question_id=2)])
    request = pb.PredictBatchRequest(model="m", learners=[learner, learner])
    assert interactions_in(request) == 8 < OFFLOAD_INTERACTIONS
    assert [len(x.history_questions) for x in batch_query(request).learners] == [3, 3]
