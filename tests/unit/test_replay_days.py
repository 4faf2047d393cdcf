"""loadtest/replay_days.py: a canonical file as simulated days (the learners of `routerkt bench loop`)."""
from __future__ import annotations

import pytest

from loadtest.replay_days import DAY_MS, START_MS, read_learners, resolve_data, schedule, write_canonical

pytestmark = pytest.mark.unit

ROWS = """user_id,order,question_id,skill_id,correct
7,0,10,1,1
7,1,11,2,0
7,2,11,3,0
7,3,12,1;2,1
7,4,13,-1,0
9,0,10,1,0
9,1,14,2,1
"""


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "interactions.csv"
    path.write_text(ROWS)
    return path


def test_each_learner_answers_its_next_interactions_each_day_in_order(data) -> None:
    learners = read_learners(data, cap=None, seed=0)
    assert [lr.user_id for lr in learners] == [7, 9]
    # the expanded multi-skill row (7: question 11 again, same answer, other skill) is merged as training merges it
    assert learners[0].questions.tolist() == [10, 11, 12, 13] and learners[0].skills[1] == (2, 3)
    days = schedule(learners, days=2, per_day=2, seed=0)
    assert len(days) == 3
    assert [[(a.learner, a.question, a.correct) for a in answers] for answers in days[0]] == \
        [[("learner-7", 10, 1), ("learner-7", 11, 0)], [("learner-9", 10, 0), ("learner-9", 14, 1)]]
    assert [[a.order for a in answers] for answers in days[1]] == [[2, 3]]          # learner 9 has no more
    assert days[2] == []
    assert days[1][0][0].skills == (1, 2) and days[1][0][1].skills == (-1,)
    for day, answers_of_day in enumerate(days):
        for answers in answers_of_day:
            stamps = [a.timestamp_ms for a in answers]
            assert stamps == sorted(stamps) and all(START_MS + day * DAY_MS <= t < START_MS + (day + 1) * DAY_MS
                                                    for t in stamps)
    assert days[1][0][0].event_id == "7-2"


def test_a_cap_draws_a_seeded_sample_in_file_order(data) -> None:
    assert [lr.user_id for lr in read_learners(data, cap=1, seed=0)] == \
        [lr.user_id for lr in read_learners(data, cap=1, seed=0)]
    assert len(read_learners(data, cap=1, seed=1)) == 1


def test_day_zero_written_as_a_canonical_file_reads_back(data, tmp_path) -> None:
    days = schedule(read_learners(data, cap=None, seed=0), days=1, per_day=3, seed=0)
    out = tmp_path / "day0.csv"
    assert write_canonical(days[0], out) == 5
    again = read_learners(out, cap=None, seed=0)
    assert again[0].questions.tolist() == [10, 11, 12] and again[0].skills[1:] == [(2, 3), (1, 2)]


def test_a_dataset_folder_names_its_interactions_file(data, tmp_path) -> None:
    assert resolve_data(tmp_path) == data
    assert resolve_data(data) == data
