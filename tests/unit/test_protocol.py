"""Tests of training/data/protocol.py: left-padded windows (recent, chunks), folds, split files."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from routerkt.contract.signature import PAD_ID
from routerkt.errors import UserError
from training.config import Protocol
from training.data.csv_reader import DataError, Interactions, read_interactions
from training.data.protocol import Fold, Sequences, load_folds_file, make_folds, make_sequences, read_folds_file
from routerkt.contract.vocab import Vocab

pytestmark = pytest.mark.unit

DATASETS = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"


def make_inter(lengths: dict[int, int]) -> Interactions:
    """Learner u answers questions 100*u + 0, 1, ... (skill = question % 3); correct alternates 1, 0."""
    users, qs = [], []
    for u, n in lengths.items():
        users += [u] * n
        qs += [100 * u + i for i in range(n)]
    q = np.asarray(qs, dtype=np.int64)
    return Interactions(user_id=np.asarray(users, dtype=np.int64), question_id=q, skill_id=q % 3,
                        correct=(np.arange(q.size) % 2 == 0).astype(np.int8))


def raw_questions(seqs: Sequences, vocab: Vocab, s: int) -> list[int]:
    inverse = {v: k for k, v in vocab.questions.items()}
    return [inverse[int(x)] for x in seqs.questions[s] if x != PAD_ID]


@pytest.fixture
def inter() -> Interactions:
    return make_inter({5: 3, 9: 12, 2: 4, 7: 25})


def test_recent_keeps_most_recent_window_left_padded(inter):
    vocab = Vocab.build(inter)
    seqs = make_sequences(inter, vocab, Protocol.RECENT, window=10, min_interactions=4)
    assert seqs.learners.tolist() == [9, 2, 7]  # learner 5 (3 rows) dropped; file order kept
    assert seqs.lengths.tolist() == [10, 4, 10]
    assert seqs.questions.shape == seqs.responses.shape == (3, 10) and seqs.skills.shape == (3, 10, 1)
    assert all(a.dtype == np.int64 for a in (seqs.questions, seqs.skills, seqs.responses, seqs.lengths))
    assert raw_questions(seqs, vocab, 0) == [900 + i for i in range(2, 12)]   # most recent 10 of 12
    assert raw_questions(seqs, vocab, 2) == [700 + i for i in range(15, 25)]
    # learner 2: 6 padding positions on the left, real interactions at the end
    assert seqs.questions[1, :6].tolist() == [PAD_ID] * 6 and seqs.skills[1, :6].tolist() == [[PAD_ID]] * 6
    assert seqs.responses[1, :6].tolist() == [-1] * 6
    assert raw_questions(seqs, vocab, 1) == [200, 201, 202, 203]
    assert (seqs.questions[1, 6:] != PAD_ID).all()
    assert set(seqs.responses[1, 6:].tolist()) <= {0, 1}
    assert seqs.window == 10 and seqs.n_interactions == 24


def test_sequence_values_match_rows(inter):
    vocab = Vocab.build(inter)
    seqs = make_sequences(inter, vocab, "recent", window=30, min_interactions=1)
    # learner 7 is the last block: rows 19..43, all 25 fit in the window of 30
    rows = slice(19, 44)
    assert seqs.questions[3, 5:].tolist() == vocab.encode_questions(inter.question_id[rows]).tolist()
    assert seqs.skills[3, 5:, 0].tolist() == vocab.encode_skills(inter.skill_id[rows, 0]).tolist()
    assert seqs.responses[3, 5:].tolist() == inter.correct[rows].tolist()


def test_skill_sets_become_a_last_axis_padded_with_pad_id(inter):
    sets = np.full((len(inter), 3), -2)                                   # NO_SKILL in unused slots
    sets[:, 0] = inter.question_id % 3
    sets[::2, 1] = 7
    sets[::4, 2] = -1                                                     # an unknown skill in a set
    multi = Interactions(user_id=inter.user_id, question_id=inter.question_id, skill_id=sets, correct=inter.correct)
    vocab = Vocab.build(multi)
    for protocol in Protocol:
        seqs = make_sequences(multi, vocab, protocol, window=10, min_interactions=4)
        assert seqs.skills.shape == seqs.questions.shape + (3,) and seqs.max_skills == 3
        real = seqs.responses >= 0
        assert (seqs.skills[~real] == PAD_ID).all()                        # padding rows: every slot PAD_ID
        assert (seqs.skills[real][:, 0] >= 2).all()                        # slot 0 always holds a skill
    seqs = make_sequences(multi, vocab, "recent", window=30, min_interactions=1)
    rows = slice(19, 44)                                                  # learner 7: rows 19..43
    assert seqs.skills[3, 5:].tolist() == vocab.encode_skill_sets(sets[rows]).tolist()
    assert {int(v) for v in seqs.skills[3, 5:, 2]} == {0, 1}               # PAD_ID or UNK_ID (-1)


def test_single_skill_sequences_equal_the_former_two_dimensional_ones(inter):
    vocab = Vocab.build(inter)
    for protocol in Protocol:
        seqs = make_sequences(inter, vocab, protocol, window=10, min_interactions=4)
        assert seqs.skills.shape == seqs.questions.shape + (1,)
        # the former [S, W] array: each real position's skill id (raw skill = question % 3), PAD_ID in padding
        flat = seqs.skills[..., 0]
        assert flat.dtype == np.int64 and ((flat == PAD_ID) == (seqs.questions == PAD_ID)).all()
        raw_q = {v: k for k, v in vocab.questions.items()}
        expected = np.vectorize(lambda q: vocab.skills[raw_q[q] % 3] if q != PAD_ID else PAD_ID)(seqs.questions)
        assert np.array_equal(flat, expected)


def test_chunks_split_history_from_the_oldest(inter):
    vocab = Vocab.build(inter)
    seqs = make_sequences(inter, vocab, Protocol.CHUNKS, window=10, min_interactions=4)
    # 9: 12 -> 10 + 2 (dropped, < 4); 2: 4 -> 4; 7: 25 -> 10 + 10 + 5
    assert seqs.learners.tolist() == [9, 2, 7, 7, 7]
    assert seqs.lengths.tolist() == [10, 4, 10, 10, 5]
    assert raw_questions(seqs, vocab, 0) == [900 + i for i in range(10)]
    assert raw_questions(seqs, vocab, 3) == [700 + i for i in range(10, 20)]
    assert raw_questions(seqs, vocab, 4) == [700 + i for i in range(20, 25)]
    assert seqs.responses[4, :5].tolist() == [-1] * 5 and seqs.questions[4, :5].tolist() == [PAD_ID] * 5


def test_chunks_keep_full_pieces_even_when_window_is_below_minimum():
    inter = make_inter({1: 7})
    seqs = make_sequences(inter, Vocab.build(inter), "chunks", window=3, min_interactions=5)
    assert seqs.lengths.tolist() == [3, 3]  # the partial piece of 1 is dropped


def test_subset_and_select_learners(inter):
    seqs = make_sequences(inter, Vocab.build(inter), "chunks", window=10, min_interactions=1)
    picked = seqs.select_learners(np.array([7, 5]))
    assert picked.learners.tolist() == [5, 7, 7, 7]
    assert picked.lengths.tolist() == [3, 10, 10, 5]
    assert len(seqs.subset(np.array([0, 2]))) == 2
    mask = seqs.lengths == 10
    assert seqs.subset(mask).lengths.tolist() == [10] * int(mask.sum())


@pytest.mark.parametrize("window, minimum, problem", [(0, 5, "window must be >= 1"),
                                                       (10, 0, "min_interactions must be >= 1")])
def test_bad_sequence_arguments(inter, window, minimum, problem):
    with pytest.raises(UserError, match=problem):
        make_sequences(inter, Vocab.build(inter), "recent", window, minimum)


def test_unknown_protocol_is_rejected(inter):
    with pytest.raises(ValueError):
        make_sequences(inter, Vocab.build(inter), "sliding", 10, 1)


# ---------------------------------------------------------------------------------------------
# Folds

def assert_partition(folds: list[Fold], ids: np.ndarray) -> None:
    for fold in folds:
        parts = [fold.train, fold.valid, fold.test]
        assert sum(p.size for p in parts) == ids.size
        assert np.array_equal(np.sort(np.concatenate(parts)), np.sort(ids))
        for p in parts:
            assert np.array_equal(p, np.sort(p))


def test_folds_disjoint_covering_and_deterministic():
    ids = np.arange(1000, 1103)  # 103 learners
    folds = make_folds(ids[::-1], n_folds=5, valid_ratio=0.1, seed=12405)
    assert [f.index for f in folds] == [0, 1, 2, 3, 4]
    assert_partition(folds, ids)
    tests = np.concatenate([f.test for f in folds])
    assert np.array_equal(np.sort(tests), ids)  # every learner is tested exactly once
    assert sorted(f.test.size for f in folds) == [20, 20, 21, 21, 21]
    assert all(f.valid.size == 9 for f in folds[:3]) and all(f.valid.size == 9 for f in folds[3:])
    again = make_folds(ids, n_folds=5, valid_ratio=0.1, seed=12405)  # input order does not matter
    assert all(np.array_equal(a.test, b.test) and np.array_equal(a.valid, b.valid) for a, b in zip(folds, again))
    other = make_folds(ids, n_folds=5, valid_ratio=0.1, seed=1)
    assert not np.array_equal(folds[0].test, other[0].test)


def test_valid_ratio_rounding_and_zero():
    ids = np.arange(40)
    folds = make_folds(ids, n_folds=4, valid_ratio=0.1, seed=3)  # 30 training learners -> 3, not 4
    assert [f.valid.size for f in folds] == [3, 3, 3, 3]
    assert all(f.valid.size == 0 for f in make_folds(ids, 4, 0.0, 3))


def test_single_fold_holds_out_twenty_percent():
    ids = np.arange(50)
    (fold,) = make_folds(ids, n_folds=1, valid_ratio=0.1, seed=7)
    assert fold.test.size == 10 and fold.valid.size == 4 and fold.train.size == 36
    assert_partition([fold], ids)


@pytest.mark.parametrize("ids, n_folds, ratio, problem", [
    (np.arange(10), 0, 0.1, "folds must be >= 1"),
    (np.arange(10), 5, 1.0, r"valid_ratio must be in \[0, 1\)"),
    (np.arange(10), 5, -0.1, r"valid_ratio must be in \[0, 1\)"),
    (np.arange(4), 5, 0.1, "too few for 5 fold"),
    (np.arange(2), 1, 0.1, "too few for 1 fold"),
])
def test_fold_argument_errors(ids, n_folds, ratio, problem):
    with pytest.raises(UserError, match=problem):
        make_folds(ids, n_folds, ratio, seed=0)


# ---------------------------------------------------------------------------------------------
# Split files

def write_json(tmp_path: Path, obj, name: str = "folds.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(obj))
    return path


def test_folds_file_fold_to_test_list(tmp_path, caplog):
    path = write_json(tmp_path, {"1": [1, 2, 3], "0": [4, 5, 6], "2": [7, 8, 999]})
    ids = np.arange(1, 21)
    with caplog.at_level(logging.WARNING):
        folds = load_folds_file(path, ids, valid_ratio=0.2, seed=5)
    assert "1 learner(s) of the folds file are not in the data" in caplog.text
    assert [f.test.tolist() for f in folds] == [[4, 5, 6], [1, 2, 3], [7, 8]]
    assert [f.valid.size for f in folds] == [4, 4, 4]  # ceil(0.2 * 17), ceil(0.2 * 18)
    assert_partition(folds, ids)
    again = load_folds_file(path, ids, valid_ratio=0.2, seed=5)
    assert all(np.array_equal(a.valid, b.valid) for a, b in zip(folds, again))


def test_folds_file_user_to_split_name(tmp_path):
    mapping = {str(u): f"fold{u % 3 + 1}" for u in range(30)}
    mapping.update({"30": "train_only", "31": "fold10"})
    folds = load_folds_file(write_json(tmp_path, mapping), np.arange(32), valid_ratio=0.1, seed=0)
    assert len(folds) == 4  # fold1, fold2, fold3, fold10 (natural order)
    assert folds[0].test.tolist() == list(range(0, 30, 3))
    assert folds[3].test.tolist() == [31]
    assert all(30 not in f.test for f in folds)
    assert_partition(folds, np.arange(32))
    assert list(read_folds_file(write_json(tmp_path, mapping))) == ["fold1", "fold2", "fold3", "fold10"]


def test_folds_file_train_test_layout(tmp_path):
    path = write_json(tmp_path, {str(u): ("test" if u < 4 else "train") for u in range(20)})
    (fold,) = load_folds_file(path, np.arange(20))
    assert fold.test.tolist() == [0, 1, 2, 3]
    assert_partition([fold], np.arange(20))


@pytest.mark.parametrize("obj, problem", [
    ({"0": [1, 2], "1": [2, 3]}, "folds '0' and '1' overlap"),
    ({"0": [1, "x"]}, "fold '0' holds 'x', expected integer learner ids"),
    ({"a": "fold1", "2": "fold2"}, "a key holds 'a'"),
    ({"0": [1], "1": "fold1"}, "values must be all lists"),
    ({}, "expected a non-empty JSON object"),
    ({"1": "train", "2": "train_only"}, "names no test learners"),
    ({"0": [100, 101]}, "fold '0' has no test learner in the data"),
])
def test_folds_file_errors(tmp_path, obj, problem):
    path = write_json(tmp_path, obj)
    with pytest.raises(DataError) as info:
        load_folds_file(path, np.arange(20))
    assert str(info.value).startswith(f"{path}: ") and problem in str(info.value)


def test_folds_file_not_json(tmp_path):
    path = tmp_path / "folds.json"
    path.write_text('{"0": [1,\n 2')
    with pytest.raises(DataError, match=r"folds.json:2: invalid JSON"):
        load_folds_file(path, np.arange(5))
    with pytest.raises(DataError, match="no such file"):
        load_folds_file(tmp_path / "missing.json", np.arange(5))


@pytest.mark.dataset
def test_assist2009_splits_file():
    folder = DATASETS / "assist2009"
    if not folder.exists():
        pytest.skip(f"dataset not available: {folder}")
    inter = read_interactions(folder / "interactions.csv.gz")
    seqs = make_sequences(inter, Vocab.build(inter), "recent", 100, 5)
    learners = np.unique(seqs.learners)
    folds = load_folds_file(folder / "splits.json", learners, valid_ratio=0.1, seed=12405)
    assert len(folds) == 5
    assert_partition(folds, learners)
    assert sum(f.test.size for f in folds) <= learners.size
