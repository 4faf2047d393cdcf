"""Tests of training/data/csv_reader.py: parsing, skill sets ("3;17"), every validation error and its line,
the former collapse_repeats (skill_rows first)."""
from __future__ import annotations

import gzip
import time
from pathlib import Path

import numpy as np
import pytest

from routerkt.errors import UserError
from routerkt.contract.signature import NO_SKILL
from training.data.csv_reader import MAX_SKILLS, DataError, Interactions, read_interactions
from training.data.skill_rows import first_rows as collapse_repeats

pytestmark = pytest.mark.unit

DATASETS = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"
H = "user_id,order,question_id,skill_id,correct\n"


def write(tmp_path: Path, text: str, name: str = "data.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(path: Path) -> str:
    with pytest.raises(DataError) as info:
        read_interactions(path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_reads_valid_file_in_file_order(tmp_path):
    path = write(tmp_path, H + "7,0,10,3,1\n7,5,11,-1,0\n2,0,-1,4,1\n2,1,10,3,1\n")
    inter = read_interactions(path)
    assert isinstance(inter, Interactions)
    assert len(inter) == 4 and inter.n_learners == 2
    assert inter.user_id.dtype == np.int64 and inter.question_id.dtype == np.int64
    assert inter.skill_id.dtype == np.int64 and inter.correct.dtype == np.int8
    assert inter.user_id.tolist() == [7, 7, 2, 2]
    assert inter.question_id.tolist() == [10, 11, -1, 10]
    assert inter.skill_id.shape == (4, 1) and inter.skill_id[:, 0].tolist() == [3, -1, 4, 3]
    assert inter.correct.tolist() == [1, 0, 1, 1]
    assert inter.learner_slices() == [(7, slice(0, 2)), (2, slice(2, 4))]
    assert inter.path == str(path)


def test_extra_columns_any_order_integral_floats_and_blank_lines(tmp_path):
    text = "note,correct,skill_id,question_id,order,user_id\nx,1,3,2,0,5\n\ny,0,3.0,2,1,5\n"
    inter = read_interactions(write(tmp_path, text))
    assert inter.user_id.tolist() == [5, 5]
    assert inter.skill_id[:, 0].tolist() == [3, 3]
    assert inter.correct.tolist() == [1, 0]


def test_skill_sets_in_one_field(tmp_path):
    # "3;17": one interaction with two skills; K is the largest set, unused slots NO_SKILL, spaces allowed
    path = write(tmp_path, H + "7,0,10,3;17,1\n7,1,11,-1,0\n7,2,12, 4 ; 5 ;6 ,1\n")
    inter = read_interactions(path)
    assert len(inter) == 3 and inter.max_skills == 3 and inter.skill_id.dtype == np.int64
    assert inter.skill_id.tolist() == [[3, 17, NO_SKILL], [-1, NO_SKILL, NO_SKILL], [4, 5, 6]]
    assert inter.line.tolist() == [2, 3, 4] and inter.rows == 3 and inter.merged_rows == 0


def test_single_skill_file_reads_as_sets_of_one(tmp_path):
    inter = read_interactions(write(tmp_path, H + "1,0,2,3,1\n1,1,2,-1,0\n"))
    assert inter.skill_id.shape == (2, 1) and inter.max_skills == 1


def test_gzip_file(tmp_path):
    path = tmp_path / "data.csv.gz"
    with gzip.open(path, "wt") as fh:
        fh.write(H + "1,0,2,3,1\n1,1,2,3,0\n")
    assert read_interactions(path).correct.tolist() == [1, 0]


@pytest.mark.parametrize("body, line, problem", [
    ("1,0,2,3,1\n1,1,abc,3,1\n", 3, "column 'question_id' must hold integers, got 'abc'"),
    ("1,0,2,3,1\n1,1,2,3.5,1\n", 3, "column 'skill_id' must hold integers, got 3.5"),
    ("1,x,2,3,1\n", 2, "column 'order' must hold integers, got 'x'"),
    ("1,0,2,3,1\n1,1,99999999999999999999,3,1\n", 3, "column 'question_id' must hold integers"),
    ("1,0,2,3,1\n1,1,,3,1\n", 3, "missing value in column 'question_id'"),
    ("1,0,2,3,1\n1,1,2\n", 3, "missing value in column 'skill_id'"),
    ("1,0,2,3,1\n1,1,2,3,2\n", 3, "column 'correct' must be 0 or 1, got 2"),
    ("1,0,2,3,1\n1,1,2,3,yes\n", 3, "column 'correct' must be 0 or 1, got 'yes'"),
    ("1,0,2,3,1\n1,1,2,3,-1\n", 3, "column 'correct' must be 0 or 1, got -1"),
    ("1,0,2,3,1\n1,1,-5,3,1\n", 3, "column 'question_id' must be >= 0 or -1 (unknown), got -5"),
    ("1,0,2,3,1\n1,1,2,-2,1\n", 3, "column 'skill_id' must be >= 0 or -1 (unknown), got -2"),
    ("1,0,2,3,1\n-1,0,2,3,1\n", 3, "column 'user_id' must be >= 0, got -1"),
    ("1,0,2,3,1\n1,1,2,3,1,9\n", 3, "6 fields, but the header has 5"),
    ("1,0,2,3,1,9\n1,1,2,3,1\n", 2, "more fields than the header has"),
    ("1,0,2,3,1\n1,5,2,3,1\n1,4,2,3,1\n", 4, "unsorted order: 4 is not greater than 5"),
    ("1,0,2,3,1\n1,0,2,3,1\n", 3, "unsorted order: 0 is not greater than 0"),
    ("1,0,2,3,1\n2,0,2,3,1\n2,1,2,3,1\n1,1,2,3,1\n", 5,
     "rows of one user are not contiguous: this user_id also appears from line 2"),
    # blank lines are skipped but still counted
    ("1,0,2,3,1\n\n\n1,1,2,3,7\n", 5, "column 'correct' must be 0 or 1, got 7"),
    # skill sets: several ids in one field
    ("1,0,2,3;17,1\n1,1,2,3;x,1\n", 3, "column 'skill_id' must hold integers separated by ';', got '3;x'"),
    ("1,0,2,3;17,1\n1,1,2,3;,1\n", 3, "column 'skill_id' must hold integers separated by ';', got '3;'"),
    ("1,0,2,3,1\n1,1,2,;4,1\n", 3, "column 'skill_id' must hold integers separated by ';', got ';4'"),
    ("1,0,2,3;17,1\n1,1,2,3;-2,1\n", 3, "column 'skill_id' must be >= 0 or -1 (unknown), got -2"),
    ("1,0,2,3;17,1\n1,1,2,4;17;4,1\n", 3, "column 'skill_id' names skill 4 twice in '4;17;4'"),
    ("1,0,2,3,1\n1,1,2," + ";".join(map(str, range(MAX_SKILLS + 1))) + ",1\n", 3,
     f"column 'skill_id' holds {MAX_SKILLS + 1} skills, at most {MAX_SKILLS} are allowed"),
    ("1,0,2,3;4,1\n1,1,2,,1\n", 3, "missing value in column 'skill_id'"),
])
def test_line_errors(tmp_path, body, line, problem):
    path = write(tmp_path, H + body)
    message = error_of(path)
    assert message.startswith(f"{path}:{line}: "), message
    assert problem in message


def test_first_offending_line_wins_across_checks(tmp_path):
    # line 3: bad correct, line 4: non-integer, line 5: bad order -> line 3 is reported
    path = write(tmp_path, H + "1,0,2,3,1\n1,1,2,3,5\n1,2,zz,3,1\n1,1,2,3,1\n")
    assert error_of(path) == f"{path}:3: column 'correct' must be 0 or 1, got 5"
    # a parse problem on a later line does not hide an earlier range problem
    path = write(tmp_path, H + "1,0,-9,3,1\n1,1,zz,3,1\n", "b.csv")
    assert error_of(path).startswith(f"{path}:2: column 'question_id' must be >= 0")


def test_same_line_reports_columns_in_order(tmp_path):
    path = write(tmp_path, H + "1,0,x,y,1\n")
    assert error_of(path) == f"{path}:2: column 'question_id' must hold integers, got 'x'"


@pytest.mark.parametrize("name, content, problem", [
    ("empty.csv", "", "empty file"),
    ("header.csv", H, "no data rows (header only)"),
    ("blank_rows.csv", H + "\n\n", "no data rows (header only)"),
])
def test_whole_file_errors(tmp_path, name, content, problem):
    path = write(tmp_path, content, name)
    assert error_of(path) == f"{path}: {problem}"


def test_missing_columns_are_named(tmp_path):
    path = write(tmp_path, "user_id,order,question,correct\n1,0,2,1\n")
    message = error_of(path)
    assert message.startswith(f"{path}: missing column(s) question_id, skill_id ")
    assert "'user_id,order,question,correct'" in message


def test_missing_file_and_directory(tmp_path):
    assert error_of(tmp_path / "nope.csv") == f"{tmp_path / 'nope.csv'}: no such file"
    assert error_of(tmp_path).startswith(f"{tmp_path}: is a directory")


def test_gz_name_without_gzip_content(tmp_path):
    path = write(tmp_path, H + "1,0,2,3,1\n", "data.csv.gz")
    assert error_of(path).startswith(f"{path}: not a gzip file")


def test_truncated_gzip(tmp_path):
    path = tmp_path / "data.csv.gz"
    path.write_bytes(gzip.compress((H + "1,0,2,3,1\n" * 50).encode())[:-10])
    assert error_of(path).startswith(f"{path}: corrupt or truncated gzip file")


def test_not_utf8(tmp_path):
    path = tmp_path / "data.csv"
    path.write_bytes(H.encode() + b"1,0,2,3,1\n\xff\xfe,0,2,3,1\n")
    assert error_of(path).startswith(f"{path}: not UTF-8 text")


def test_data_error_is_a_user_error():
    assert issubclass(DataError, UserError)


def test_reading_writes_nothing(tmp_path):
    path = write(tmp_path, H + "1,0,2,3,1\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    read_interactions(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_collapse_repeats_merges_multi_skill_rows_only(tmp_path):
    rows = [
        "1,0,10,3,1", "1,1,10,4,1", "1,2,10,5,1",  # one problem with 3 skills -> 1 row
        "1,3,10,5,1",                              # repeat with the same skill as the previous row: kept
        "1,5,11,3,0", "1,6,11,4,1",                # different answers: kept
        "1,7,-1,3,1", "1,8,-1,4,1",                # unknown question: never merged
        "2,0,11,4,1",                              # next learner, same question as the previous row: kept
    ]
    inter = read_interactions(write(tmp_path, H + "\n".join(rows) + "\n"))
    out = collapse_repeats(inter)
    assert out.skill_id[:, 0].tolist() == [3, 5, 3, 4, 3, 4, 4]
    assert out.question_id.tolist() == [10, 10, 11, 11, -1, -1, 11]
    assert out.user_id.tolist() == [1, 1, 1, 1, 1, 1, 2]
    assert out.correct.dtype == np.int8 and out.path == inter.path


@pytest.mark.dataset
def test_assist2009_real_file():
    path = DATASETS / "assist2009" / "interactions.csv.gz"
    if not path.exists():
        pytest.skip(f"dataset not available: {path}")
    inter = read_interactions(path)
    assert len(inter) == 325_637
    assert inter.n_learners == 4_151
    assert len(np.unique(inter.question_id)) == 16_891
    assert len(np.unique(inter.skill_id)) == 110
    assert len(collapse_repeats(inter)) == 325_637 - 51_052  # README: multi-skill expansion rows


@pytest.mark.dataset
def test_assist2017_read_and_sequences_timing():
    """Reports (never asserts) how long reading + make_sequences take on the largest file."""
    from training.data.protocol import make_sequences
    from routerkt.contract.vocab import Vocab

    path = DATASETS / "assist2017" / "interactions.csv.gz"
    if not path.exists():
        pytest.skip(f"dataset not available: {path}")
    t0 = time.perf_counter()
    inter = read_interactions(path)
    t1 = time.perf_counter()
    vocab = Vocab.build(inter)
    seqs = make_sequences(inter, vocab, "recent", 100, 5)
    t2 = time.perf_counter()
    chunks = make_sequences(inter, vocab, "chunks", 100, 5)
    t3 = time.perf_counter()
    print(f"\nassist2017: read {t1 - t0:.2f}s, vocab+recent {t2 - t1:.2f}s, chunks {t3 - t2:.2f}s")
    assert len(inter) == 941_502 and inter.n_learners == 1_705
    assert len(seqs) == int((inter.segments()[2] >= 5).sum())
    assert chunks.n_interactions > seqs.n_interactions
