"""Tests of routerkt/contract/vocab.py: deterministic ids, vectorised encoding, JSON round trip, bad files."""
from __future__ import annotations

import json

import numpy as np
import pytest

from routerkt.contract.signature import FIRST_ID, PAD_ID, UNK_ID
from routerkt.contract.vocab import VocabError
from training.data.csv_reader import Interactions
from routerkt.contract.vocab import FORMAT, Vocab

pytestmark = pytest.mark.unit


def make_inter(questions, skills, users=None) -> Interactions:
    n = len(questions)
    users = users if users is not None else [1] * n
    return Interactions(user_id=np.asarray(users, dtype=np.int64),
                        question_id=np.asarray(questions, dtype=np.int64),
                        skill_id=np.asarray(skills, dtype=np.int64),
                        correct=np.zeros(n, dtype=np.int8))


@pytest.fixture
def vocab() -> Vocab:
    # question 30 first appears without a skill, then with skill 7; question 40 never has a skill
    return Vocab.build(make_inter([50, 30, 30, 10, -1, 40, 10], [9, -1, 7, 5, 9, -1, 9]))


def test_build_sorts_raw_ids_and_skips_unknown(vocab):
    assert vocab.questions == {10: 2, 30: 3, 40: 4, 50: 5}
    assert vocab.skills == {5: 2, 7: 3, 9: 4}
    assert vocab.n_questions == 4 + 2 and vocab.n_skills == 3 + 2
    assert min(vocab.questions.values()) == FIRST_ID


def test_question_skill_first_known_occurrence(vocab):
    assert vocab.question_skill == {10: 5, 30: 7, 40: -1, 50: 9}
    assert vocab.skills_of_questions(np.array([30, 40, 99, -1])).tolist() == [7, -1, -1, -1]


def test_build_is_deterministic_regardless_of_row_order():
    a = Vocab.build(make_inter([3, 1, 2], [0, 0, 1]))
    b = Vocab.build(make_inter([2, 3, 1], [1, 0, 0]))
    assert a.questions == b.questions and a.skills == b.skills


def test_encode_unknown_and_minus_one_to_unk(vocab):
    out = vocab.encode_questions(np.array([[10, 999], [-1, 50]]))
    assert out.dtype == np.int64 and out.shape == (2, 2)
    assert out.tolist() == [[2, UNK_ID], [UNK_ID, 5]]
    assert vocab.encode_skills(np.array([9, 5, 6, -1, 10**12])).tolist() == [4, 2, UNK_ID, UNK_ID, UNK_ID]


def test_encode_never_returns_pad(vocab):
    raw = np.random.default_rng(0).integers(-1, 60, 1000)
    assert PAD_ID not in vocab.encode_questions(raw)


def test_encode_matches_dict_lookup_on_a_million_rows():
    rng = np.random.default_rng(1)
    known = rng.choice(10**7, 5000, replace=False)
    vocab = Vocab.build(make_inter(known.tolist(), [0] * known.size))
    raw = np.concatenate([rng.choice(known, 900_000), rng.integers(-1, 10**7, 100_000)])
    out = vocab.encode_questions(raw)
    sample = rng.choice(raw.size, 2000, replace=False)
    assert [vocab.questions.get(int(r), UNK_ID) for r in raw[sample]] == out[sample].tolist()


def test_empty_vocab_maps_everything_to_unk():
    vocab = Vocab.build(make_inter([-1, -1], [3, 4]))
    assert vocab.questions == {} and vocab.n_questions == 2
    assert vocab.encode_questions(np.array([-1, 0, 5])).tolist() == [UNK_ID] * 3


def test_json_round_trip_through_file(vocab, tmp_path):
    path = tmp_path / "sub" / "vocab.json"
    vocab.save(path)
    d = json.loads(path.read_text())
    assert d["format"] == FORMAT and d["pad_id"] == 0 and d["unk_id"] == 1
    assert d["questions"] == {"10": 2, "30": 3, "40": 4, "50": 5}
    assert d["question_skills"]["40"] == [-1]
    loaded = Vocab.load(path)
    assert loaded == vocab
    assert loaded.encode_questions(np.array([30, 31])).tolist() == [3, UNK_ID]
    assert sorted(p.name for p in path.parent.iterdir()) == ["vocab.json"]  # no temp file left


def test_from_json_of_to_json(vocab):
    assert Vocab.from_json(json.loads(json.dumps(vocab.to_json()))) == vocab


@pytest.mark.parametrize("content, problem", [
    ("{not json", ":1: invalid JSON"),
    ("[]", ": expected a JSON object, got list"),
    ('{"format": "other"}', ": format is 'other', expected 'routerkt-vocab/2'"),
    ('{"format": "routerkt-vocab/2", "pad_id": 0, "unk_id": 1, "questions": {}, "skills": {}, '
     '"question_skills": {"5": []}}', ": 'question_skills' maps '5' to [], expected a non-empty list of integers"),
    ('{"format": "routerkt-vocab/1", "pad_id": 1, "unk_id": 1}', ": pad_id is 1, this code uses 0"),
    ('{"format": "routerkt-vocab/1", "pad_id": 0, "unk_id": 1, "questions": [], "skills": {}, '
     '"question_skill": {}}', ": 'questions' must be an object"),
    ('{"format": "routerkt-vocab/1", "pad_id": 0, "unk_id": 1, "questions": {"a": 2}, "skills": {}, '
     '"question_skill": {}}', ": 'questions' has a non-integer key 'a'"),
    ('{"format": "routerkt-vocab/1", "pad_id": 0, "unk_id": 1, "questions": {"5": 2, "6": 4}, "skills": {}, '
     '"question_skill": {}}', ": 'questions' ids must be exactly 2..3"),
    ('{"format": "routerkt-vocab/1", "pad_id": 0, "unk_id": 1, "questions": {"5": "2"}, "skills": {}, '
     '"question_skill": {}}', ": 'questions' maps '5' to '2', expected an integer"),
    ('{"format": "routerkt-vocab/1", "pad_id": 0, "unk_id": 1, "questions": {}, "skills": {"-1": 2}, '
     '"question_skill": {}}', ": 'skills' has a negative raw id"),
])
def test_load_bad_files(tmp_path, content, problem):
    path = tmp_path / "vocab.json"
    path.write_text(content)
    with pytest.raises(VocabError) as info:
        Vocab.load(path)
    message = str(info.value)
    assert message.startswith(f"{path}{problem}"), message
    assert "\n" not in message


def test_load_missing_file(tmp_path):
    with pytest.raises(VocabError, match="no such file"):
        Vocab.load(tmp_path / "missing.json")


def test_importing_vocab_needs_neither_pandas_nor_torch():
    import subprocess
    import sys

    code = ("import sys, routerkt.contract.vocab; "
            "print(sorted(m for m in ('pandas', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_skill_sets_build_read_and_encode(tmp_path):
    """Questions tagged with several skills keep their set; format 1 files still read."""
    from types import SimpleNamespace

    from routerkt.contract.signature import NO_SKILL, PAD_ID
    inter = SimpleNamespace(question_id=np.array([10, 10, 30, 40]),
                            skill_id=np.array([[5, 6], [5, 6], [7, NO_SKILL], [-1, NO_SKILL]]))
    vocab = Vocab.build(inter)
    assert vocab.question_skills == {10: (5, 6), 30: (7,), 40: (-1,)} and vocab.max_skills == 2
    assert vocab.skill_sets_of_questions(np.array([10, 30, 99])).tolist() == [[5, 6], [7, NO_SKILL], [-1, NO_SKILL]]
    assert vocab.encode_skill_sets(np.array([[5, NO_SKILL], [-1, 6]])).tolist() == \
        [[vocab.skills[5], PAD_ID], [UNK_ID, vocab.skills[6]]]
    assert Vocab.from_json(json.loads(json.dumps(vocab.to_json()))) == vocab
    old = tmp_path / "v1.json"
    old.write_text(json.dumps({"format": "routerkt-vocab/1", "pad_id": 0, "unk_id": 1, "questions": {"10": 2},
                               "skills": {"5": 2}, "question_skill": {"10": 5}}))
    assert Vocab.load(old).question_skills == {10: (5,)}
