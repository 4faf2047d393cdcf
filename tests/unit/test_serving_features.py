"""serving/encoder/window.py: vocabulary mapping (unknown ids) and the left-padded candidate windows."""
from __future__ import annotations

import numpy as np
import pytest

from routerkt.contract.signature import PAD_ID, UNK_ID
from serving.encoder.window import CANDIDATE_RESPONSE, PAD_RESPONSE, build_windows, encode_learner
from serving.api import knowledge_tracing_pb2 as pb
from serving.settings import Settings
from serving.transport.grpc_api import predict_query
from serving.core.validation import validate_query
from routerkt.contract.vocab import Vocab

pytestmark = pytest.mark.unit


def validate_predict(request: pb.PredictRequest, settings: Settings):
    """A PredictRequest through the gRPC adapter's conversion and the structural validation."""
    return validate_query(predict_query(request), settings)[0]

# raw questions 100.. -> ids 2..; raw skills 7 -> 2, 8 -> 3; question 103 was only seen without a skill
VOCAB = Vocab(questions={100: 2, 101: 3, 102: 4, 103: 5}, skills={7: 2, 8: 3},
              question_skill={100: 7, 101: 8, 102: 7, 103: -1})
SETTINGS = Settings().validate()


def learner(history: list[tuple[int, int | None, int]], candidates: list[tuple[int, int | None]]):
    req = pb.PredictRequest(
        model="kt",
        history=[pb.Interaction(question_id=q, correct=c, **({} if s is None else {"skill_id": s}))
                 for q, s, c in history],
        candidates=[pb.Candidate(question_id=q, **({} if s is None else {"skill_id": s})) for q, s in candidates])
    return validate_predict(req, SETTINGS)


def encode(history, candidates, window=6):
    counts: dict[str, int] = {}

    def count(kind: str, n: int) -> None:
        counts[kind] = counts.get(kind, 0) + n
    return encode_learner(learner(history, candidates), VOCAB, window, count), counts


def test_known_ids_map_through_the_vocabulary_and_absent_skills_come_from_the_question() -> None:
    enc, counts = encode([(100, 7, 1), (101, None, 0)], [(102, None), (101, 7)])
    assert enc.questions.tolist() == [2, 3]
    assert enc.skills.tolist() == [[2], [3]]           # 101's recorded skill is 8 -> id 3; sets of one
    assert enc.responses.tolist() == [1, 0]
    assert enc.candidate_questions.tolist() == [4, 3]
    assert enc.candidate_skills.tolist() == [[2], [2]]  # explicit skill 7 wins over the recorded 8
    assert counts == {}


def test_unknown_question_maps_to_unk_and_keeps_an_explicit_skill() -> None:
    enc, counts = encode([(999, 8, 1)], [(12345, 7), (54321, None)])
    assert enc.questions.tolist() == [UNK_ID]
    assert enc.skills.tolist() == [[3]]
    assert enc.candidate_questions.tolist() == [UNK_ID, UNK_ID]
    assert enc.candidate_skills.tolist() == [[2], [UNK_ID]]   # unknown question without skill: UNK skill
    assert counts == {"question": 3, "skill": 1}


def test_skill_minus_one_and_questions_without_recorded_skill_map_to_unk() -> None:
    enc, counts = encode([(100, -1, 1), (103, None, 1)], [(100, -1)])
    assert enc.skills.tolist() == [[UNK_ID], [UNK_ID]]
    assert enc.candidate_skills.tolist() == [[UNK_ID]]
    assert counts == {"skill": 3}


def test_windows_are_left_padded_with_the_candidate_last() -> None:
    enc, _ = encode([(100, 7, 1), (101, 8, 0)], [(102, None), (103, 8)], window=6)
    q, s, r = build_windows(enc, 6)
    assert q.shape == r.shape == (2, 6) and s.shape == (2, 6, 1) and q.dtype == np.int64
    assert q.tolist() == [[PAD_ID, PAD_ID, PAD_ID, 2, 3, 4], [PAD_ID, PAD_ID, PAD_ID, 2, 3, 5]]
    assert s[..., 0].tolist() == [[PAD_ID, PAD_ID, PAD_ID, 2, 3, 2], [PAD_ID, PAD_ID, PAD_ID, 2, 3, 3]]
    assert r.tolist() == [[PAD_RESPONSE] * 3 + [1, 0, CANDIDATE_RESPONSE]] * 2


def test_empty_history_gives_a_row_of_padding_and_the_candidate() -> None:
    enc, _ = encode([], [(100, None)], window=5)
    assert enc.history_used == 0
    q, s, r = build_windows(enc, 5)
    assert q.tolist() == [[PAD_ID] * 4 + [2]]
    assert s[..., 0].tolist() == [[PAD_ID] * 4 + [2]]
    assert r.tolist() == [[PAD_RESPONSE] * 4 + [CANDIDATE_RESPONSE]]


def test_long_history_keeps_the_most_recent_window_minus_one() -> None:
    history = [(100 + (i % 3), None, i % 2) for i in range(10)]   # oldest first
    enc, _ = encode(history, [(103, 8)], window=4)
    assert enc.history_used == 3
    assert enc.questions.tolist() == [VOCAB.questions[100 + (i % 3)] for i in (7, 8, 9)]
    assert enc.responses.tolist() == [1, 0, 1]
    q, _, r = build_windows(enc, 4)
    assert q.tolist() == [[3, 4, 2, 5]]                 # no padding left, candidate at index 3
    assert r.tolist() == [[1, 0, 1, CANDIDATE_RESPONSE]]


def test_history_exactly_window_minus_one_fills_the_row() -> None:
    enc, _ = encode([(100, 7, 1)] * 3, [(101, None)], window=4)
    q, _, _ = build_windows(enc, 4)
    assert enc.history_used == 3 and PAD_ID not in q.tolist()[0]


def test_all_rows_share_the_history_part() -> None:
    enc, _ = encode([(100, 7, 1), (102, 7, 0)], [(100, None), (101, None), (102, None), (555, 8)], window=8)
    q, s, r = build_windows(enc, 8)
    assert (q[:, :-1] == q[0, :-1]).all() and (s[:, :-1] == s[0, :-1]).all() and (r[:, :-1] == r[0, :-1]).all()
    assert q[:, -1].tolist() == [2, 3, 4, UNK_ID]


def test_split_candidates_keeps_order_history_and_owners():
    from serving.encoder.window import EncodedLearner, split_candidates
    history = np.array([5, 6], dtype=np.int64)
    big = EncodedLearner(questions=history, skills=history[:, None], responses=np.array([1, 0]),
                         candidate_questions=np.arange(10, 15), candidate_skills=np.arange(20, 25)[:, None])
    small = EncodedLearner(questions=history, skills=history[:, None], responses=np.array([1, 0]),
                           candidate_questions=np.arange(2), candidate_skills=np.arange(2)[:, None])
    pieces, owners = split_candidates([big, small], 2)
    assert owners == [0, 0, 0, 1]
    assert [p.candidate_questions.tolist() for p in pieces] == [[10, 11], [12, 13], [14], [0, 1]]
    assert [p.candidate_skills[:, 0].tolist() for p in pieces[:3]] == [[20, 21], [22, 23], [24]]
    assert all(p.questions is history for p in pieces) and pieces[3] is small
