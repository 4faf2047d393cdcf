"""Skill SETS at the gateway's edge (serving/core/calls.py, transport/grpc_api.py, transport/http_routes.py,
validation.py, sessions/events.py): `skill_ids` on Interaction, Candidate and Event, the ragged
HistoryColumns form (skill_lengths + skill_values), rows [N, K] padded with NO_SKILL, and every bad
input answered INVALID_ARGUMENT naming its field."""
from __future__ import annotations

import grpc
import numpy as np
import pytest

from routerkt.contract.signature import NO_SKILL
from serving.api import knowledge_tracing_pb2 as pb
from serving.status_errors import ServingError
from serving.core.calls import ABSENT_SKILL, INVALID_SKILL, LearnerQuery
from serving.sessions.events import validate_observe
from serving.settings import Settings
from serving.transport.grpc_api import batch_query, observe_query, predict_query
from serving.transport.http_models import PredictIn
from serving.transport.http_routes import learner_query
from serving.core.validation import validate_query

pytestmark = pytest.mark.unit

SETTINGS = Settings().validate()
N = NO_SKILL


def rejected(call) -> ServingError:
    with pytest.raises(ServingError) as info:
        call()
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.message.startswith(info.value.field + ": ")
    return info.value


def predict(history=(), candidates=None, columns=None, max_skills: int = 8):
    request = pb.PredictRequest(model="m", history=list(history),
                                candidates=candidates or [pb.Candidate(question_id=1)],
                                **({"history_columns": columns} if columns is not None else {}))
    return validate_query(predict_query(request, max_skills), SETTINGS)[0]


def test_sets_single_ids_and_absent_skills_become_one_padded_array():
    learner = predict([pb.Interaction(question_id=1, skill_ids=[3, 17], correct=1),
                       pb.Interaction(question_id=2, skill_id=5, correct=0),
                       pb.Interaction(question_id=3, correct=1),
                       pb.Interaction(question_id=4, skill_ids=[-1], correct=1)],
                      [pb.Candidate(question_id=9, skill_ids=[4, 5, 6]), pb.Candidate(question_id=8)])
    assert learner.history_skills.tolist() == [[3, 17], [5, N], [ABSENT_SKILL, N], [-1, N]]
    assert learner.history_sets.tolist() == [True, False, False, True]
    assert learner.candidate_skills.tolist() == [[4, 5, 6], [ABSENT_SKILL, N, N]]
    assert learner.history_skills.dtype == np.int64 and learner.history_skills.flags["C_CONTIGUOUS"]


def test_single_skill_requests_keep_one_column_and_no_set_marks():
    learner = predict([pb.Interaction(question_id=1, skill_id=3, correct=1)] * 3)
    assert learner.history_skills.shape == (3, 1) and learner.history_sets is None
    assert learner.candidate_skills.shape == (1, 1) and learner.candidate_sets is None


@pytest.mark.parametrize("history, candidates, field", [
    ([pb.Interaction(question_id=1, skill_id=3, skill_ids=[3], correct=1)], None, "history[0].skill_ids"),
    ([], [pb.Candidate(question_id=1), pb.Candidate(question_id=1, skill_id=-1, skill_ids=[4])], "candidates[1].skill_ids"),
    ([pb.Interaction(question_id=1, skill_ids=list(range(9)), correct=1)], None, "history[0].skill_ids"),
    ([pb.Interaction(question_id=1, skill_ids=[4, 7, 4], correct=1)], None, "history[0].skill_ids"),
    ([pb.Interaction(question_id=1, skill_ids=[-1, -1], correct=1)], None, "history[0].skill_ids"),
    ([pb.Interaction(question_id=1, skill_ids=[4], correct=1), pb.Interaction(question_id=1, skill_ids=[4, -5])],
     None, "history[1].skill_ids[1]"),
    ([pb.Interaction(question_id=1, skill_ids=[4], correct=1), pb.Interaction(question_id=1, skill_id=-5)],
     None, "history[1].skill_id"),
    ([], [pb.Candidate(question_id=1, skill_ids=[-2])], "candidates[0].skill_ids[0]"),
])
def test_bad_skill_sets_name_their_field(history, candidates, field):
    assert rejected(lambda: predict(history, candidates)).field == field


def test_the_limit_comes_from_the_settings_and_prefixes_name_the_learner():
    assert rejected(lambda: predict([pb.Interaction(question_id=1, skill_ids=[1, 2, 3], correct=1)],
                                    max_skills=2)).field == "history[0].skill_ids"
    ok = pb.LearnerRequest(candidates=[pb.Candidate(question_id=1)])
    bad = pb.LearnerRequest(candidates=[pb.Candidate(question_id=1, skill_ids=[2, 2])])
    error = rejected(lambda: batch_query(pb.PredictBatchRequest(model="m", learners=[ok, bad])))
    assert error.field == "learners[1].candidates[0].skill_ids"
    query = LearnerQuery.from_values([], [(1, [1, 2, 3])])            # not from a transport: validation checks
    error = rejected(lambda: validate_query(_query(query), Settings(max_skills_per_interaction=2).validate()))
    assert error.field == "candidates[0].skill_ids"


def _query(learner: LearnerQuery):
    from serving.core.calls import PredictQuery
    return PredictQuery(model="m", version=0, learners=[learner])


def test_ragged_columns_equal_the_message_form():
    messages = [pb.Interaction(question_id=1, skill_ids=[3, 17], correct=1), pb.Interaction(question_id=2, correct=0),
                pb.Interaction(question_id=3, skill_ids=[-1], correct=1)]
    columns = pb.HistoryColumns(question_ids=[1, 2, 3], correct=[1, 0, 1], skill_lengths=[2, 0, 1],
                                skill_values=[3, 17, -1])
    a, b = predict(messages), predict(columns=columns)
    for name in ("history_questions", "history_skills", "history_correct"):
        assert getattr(a, name).tolist() == getattr(b, name).tolist(), name
    assert b.history_sets.tolist() == [True, False, True]


@pytest.mark.parametrize("columns, field", [
    (dict(skill_lengths=[1, 1], skill_values=[5]), "history_columns.skill_lengths"),           # do not add up
    (dict(skill_lengths=[1, 1], skill_values=[5, 6, 7]), "history_columns.skill_lengths"),
    (dict(skill_lengths=[1], skill_values=[5]), "history_columns.skill_lengths"),              # one per question
    (dict(skill_values=[5, 6]), "history_columns.skill_lengths"),                             # values, no lengths
    (dict(skill_ids=[5, 6], skill_lengths=[1, 1], skill_values=[5, 6]), "history_columns.skill_lengths"),  # both
    (dict(skill_lengths=[1, -1], skill_values=[5]), "history_columns.skill_lengths[1]"),
    (dict(skill_lengths=[9, 0], skill_values=list(range(9))), "history_columns.skill_lengths[0]"),
    (dict(skill_lengths=[2, 1], skill_values=[5, 5, 6]), "history[0].skill_ids"),             # a repeat
    (dict(skill_lengths=[0, 2], skill_values=[5, -4]), "history[1].skill_ids[1]"),
])
def test_bad_ragged_columns_name_their_field(columns, field):
    history = pb.HistoryColumns(question_ids=[1, 2], correct=[1, 0], **columns)
    assert rejected(lambda: predict(columns=history)).field == field
    batch = pb.PredictBatchRequest(model="m", learners=[
        pb.LearnerRequest(candidates=[pb.Candidate(question_id=1)]),
        pb.LearnerRequest(history_columns=history, candidates=[pb.Candidate(question_id=1)])])
    assert rejected(lambda: validate_query(batch_query(batch), SETTINGS)).field == f"learners[1].{field}"


def test_the_http_mirror_converts_alike():
    body = {"model": "m", "history": [{"question_id": 1, "skill_ids": [3, 17], "correct": 1},
                                      {"question_id": 2, "skill_id": 5, "correct": 0}],
            "candidates": [{"question_id": 9, "skill_ids": [4]}, {"question_id": 8}]}
    http = learner_query(PredictIn.model_validate(body))
    grpc_form = predict_query(pb.PredictRequest(**{**body, "history": [pb.Interaction(**h) for h in body["history"]],
                                                   "candidates": [pb.Candidate(**c) for c in body["candidates"]]}))
    for name in ("history_questions", "history_skills", "history_correct", "candidate_questions", "candidate_skills",
                 "history_sets", "candidate_sets"):
        assert getattr(http, name).tolist() == getattr(grpc_form.learners[0], name).tolist(), name
    both = {**body, "history": [{"question_id": 1, "skill_id": 3, "skill_ids": [3], "correct": 1}]}
    assert rejected(lambda: learner_query(PredictIn.model_validate(both))).field == "history[0].skill_ids"
    ragged = {"model": "m", "candidates": [{"question_id": 1}],
              "history_columns": {"question_ids": [1, 2], "correct": [1, 1], "skill_lengths": [2, 2],
                                  "skill_values": [1, 2, 3]}}
    assert rejected(lambda: learner_query(PredictIn.model_validate(ragged), "learners[0].")).field == \
        "learners[0].history_columns.skill_lengths"
    assert rejected(lambda: learner_query(PredictIn.model_validate(body), max_skills=1)).field == "history[0].skill_ids"


def observe(events, settings=SETTINGS):
    query = observe_query(pb.ObserveRequest(learner_id="l", events=events), settings.max_skills_per_interaction)
    validate_observe(query, settings)
    return query


def test_observe_keeps_each_events_set():
    query = observe([pb.Event(event_id="a", question_id=1, skill_ids=[3, 17], correct=1),
                     pb.Event(event_id="b", question_id=2, skill_id=5, correct=0),
                     pb.Event(event_id="c", question_id=3, correct=1)])
    assert query.skills.tolist() == [[3, 17], [5, N], [ABSENT_SKILL, N]]
    assert query.stored_skills() == [(3, 17), (5,), ()]
    single = observe([pb.Event(event_id="a", question_id=1, skill_id=-1, correct=1),
                      pb.Event(event_id="b", question_id=1, correct=1)])
    assert single.skills.shape == (2, 1) and single.stored_skills() == [(-1,), ()]


@pytest.mark.parametrize("event, field", [
    (pb.Event(event_id="x", question_id=1, skill_id=3, skill_ids=[4], correct=1), "events[1].skill_ids"),
    (pb.Event(event_id="x", question_id=1, skill_ids=[3, -7], correct=1), "events[1].skill_ids[1]"),
    (pb.Event(event_id="x", question_id=1, skill_ids=list(range(9)), correct=1), "events[1].skill_ids"),
    (pb.Event(event_id="x", question_id=1, skill_ids=[6, 6], correct=1), "events[1].skill_ids"),
])
def test_bad_events_name_their_field(event, field):
    good = pb.Event(event_id="ok", question_id=1, skill_ids=[1, 2], correct=1)
    assert rejected(lambda: observe([good, event])).field == field


def test_observe_stores_skill_ids_no_served_version_knows():
    """Ids are the platform's: a skill added after the served versions were trained is stored as given
    (mapped to the unknown id at prediction time, given an id by the retrain's grown vocabulary)."""
    query = observe([pb.Event(event_id="a", question_id=1, skill_ids=[3, 10**12], correct=1),
                     pb.Event(event_id="b", question_id=10**9, skill_id=424242, correct=0)])
    assert query.stored_skills() == [(3, 10**12), (424242,)]


def test_invalid_skill_marks_stay_apart_from_absent():
    learner = LearnerQuery.from_values([(1, None, 1), (2, [3, -4], 1)], [(1, -9)])
    assert learner.history_skills.tolist() == [[ABSENT_SKILL, N], [3, INVALID_SKILL]]
    assert learner.candidate_skills.tolist() == [[INVALID_SKILL]]
