"""Tests of training/data/synthetic.py and the `routerkt synth` command: determinism, format, and that
the generated data has learnable structure (question effects, history, forgetting, the pivotal skill)."""
from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
import pytest

from routerkt import cli
from routerkt.errors import UserError
from training.data import cli_synth
from training.data.csv_reader import COLUMNS, read_interactions
from training.data.synthetic import SyntheticConfig, dependent_skills, generate, simulate, write_csv

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def data() -> tuple[pd.DataFrame, pd.DataFrame]:
    return simulate(SyntheticConfig(n_learners=400, seed=11))


def auc(y: np.ndarray, p: np.ndarray) -> float:
    """Mann-Whitney AUC with average ranks for ties."""
    order = np.argsort(p, kind="mergesort")
    ranks = np.empty(p.size)
    sorted_p = p[order]
    _, first, counts = np.unique(sorted_p, return_index=True, return_counts=True)
    avg = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg, counts)
    n1 = y.sum()
    n0 = y.size - n1
    return float((ranks[y == 1].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def test_deterministic_by_seed():
    a = generate(30, seed=3)
    b = generate(30, seed=3)
    c = generate(30, seed=4)
    pd.testing.assert_frame_equal(a, b)
    assert not a.equals(c)


def test_canonical_columns_and_ranges():
    df = generate(40, seed=5, n_skills=8, n_questions=30, min_len=12, max_len=60)
    assert list(df.columns) == list(COLUMNS)
    assert all(df[c].dtype == np.int64 for c in COLUMNS)
    sizes = df.groupby("user_id").size()
    assert sizes.index.tolist() == list(range(40))
    assert sizes.min() >= 12 and sizes.max() <= 60 and sizes.nunique() > 5
    assert (df.groupby("user_id")["order"].apply(lambda o: o.tolist() == list(range(len(o))))).all()
    assert df["question_id"].between(0, 29).all() and df["skill_id"].between(0, 7).all()
    assert set(df["correct"].unique()) == {0, 1}
    # one skill per question
    assert (df.groupby("question_id")["skill_id"].nunique() == 1).all()


def test_default_output_is_unchanged_by_the_multi_skill_option():
    # the file every committed synthetic number came from (SyntheticConfig defaults), byte for byte
    import hashlib
    df, _ = simulate(SyntheticConfig())
    assert hashlib.sha256(df.to_csv(index=False).encode()).hexdigest() == \
        "c24ae99a9cc86965cc1daece69f977a76ba9008257885d388ce88ec835b1c9b5"


def test_multi_skill_questions_one_field_or_expanded_rows(tmp_path):
    from training.data.skill_rows import merge_rows
    plain = generate(60, seed=3)
    field = generate(60, seed=3, multi_skill=0.3)
    rows = generate(60, seed=3, multi_skill=0.3, expanded=True)
    assert field[["user_id", "order", "question_id", "correct"]].equals(plain[["user_id", "order", "question_id", "correct"]])
    tagged = field["skill_id"].str.contains(";")
    assert 0.15 < tagged.mean() < 0.45
    assert (field["skill_id"].str.split(";").str[0].astype(np.int64) == plain["skill_id"]).all()
    assert len(rows) == len(plain) + int(tagged.sum())
    assert (rows.groupby("user_id")["order"].apply(lambda o: o.tolist() == list(range(len(o))))).all()
    write_csv(field, tmp_path / "field.csv")
    write_csv(rows, tmp_path / "rows.csv")
    one, expanded = read_interactions(tmp_path / "field.csv"), read_interactions(tmp_path / "rows.csv")
    assert one.max_skills == 2 and expanded.max_skills == 1
    merged = merge_rows(expanded)                                 # the merge rule restores the one-field form
    assert merged.merged_rows == int(tagged.sum())
    assert np.array_equal(merged.skill_id, one.skill_id) and np.array_equal(merged.correct, one.correct)


def test_profiles_have_reviewers(data):
    df, profiles = data
    assert len(profiles) == 400 and set(profiles.columns) >= {"user_id", "ability", "tau", "reviewer", "period"}
    share = profiles["reviewer"].mean()
    assert 0.15 < share < 0.45
    assert (profiles.loc[profiles["reviewer"], "period"].between(4, 8)).all()


@pytest.mark.parametrize("kwargs, problem", [
    (dict(n_learners=0), "learners must be >= 1"),
    (dict(n_learners=5, n_skills=1), "skills must be >= 2"),
    (dict(n_learners=5, n_skills=10, n_questions=5), r"questions \(5\) must be >= skills \(10\)"),
    (dict(n_learners=5, min_len=20, max_len=10), "need 1 <= min-len <= max-len"),
    (dict(n_learners=5, min_len=0), "need 1 <= min-len <= max-len"),
    (dict(n_learners=5, multi_skill=1.5), r"multi-skill must be a share in \[0, 1\]"),
])
def test_bad_parameters(kwargs, problem):
    with pytest.raises(UserError, match=problem):
        simulate(SyntheticConfig(**kwargs))


@pytest.mark.parametrize("name", ["syn.csv", "syn.csv.gz"])
def test_written_file_reads_back(tmp_path, name):
    df = generate(25, seed=2)
    path = tmp_path / "deep" / name
    write_csv(df, path)
    inter = read_interactions(path)
    assert inter.n_learners == 25 and len(inter) == len(df)
    assert inter.question_id.tolist() == df["question_id"].tolist()
    assert inter.correct.tolist() == df["correct"].tolist()
    assert [p.name for p in path.parent.iterdir()] == [name]  # no temp file left behind
    first = path.read_bytes()
    write_csv(df, path)
    assert path.read_bytes() == first  # reproducible bytes, gzip included


def test_per_question_means_beat_the_global_mean(data):
    df, _ = data
    train = df[df["user_id"] < 300]
    test = df[df["user_id"] >= 300]
    global_mean = train["correct"].mean()
    per_q = test["question_id"].map(train.groupby("question_id")["correct"].mean()).fillna(global_mean)
    y = test["correct"].to_numpy()
    assert auc(y, per_q.to_numpy()) > 0.6  # the global mean scores exactly 0.5
    brier_q = np.mean((per_q.to_numpy() - y) ** 2)
    brier_global = np.mean((global_mean - y) ** 2)
    assert brier_q < brier_global - 0.005


def with_history(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    by_skill = df.groupby(["user_id", "skill_id"])
    df["prev_correct"] = by_skill["correct"].shift(1)
    df["gap"] = df["order"] - by_skill["order"].shift(1)
    hit0 = ((df["skill_id"] == 0) & (df["correct"] == 1)).astype(int)
    df["pivot_hits_before"] = hit0.groupby(df["user_id"]).cumsum() - hit0
    return df


def test_history_matters(data):
    df = with_history(data[0])
    after = df.dropna(subset=["prev_correct"]).groupby("prev_correct")["correct"].mean()
    assert after[1.0] - after[0.0] > 0.1  # right after a correct answer on the same skill vs a wrong one


def test_forgetting(data):
    df = with_history(data[0]).dropna(subset=["gap"])
    recent = df.loc[df["gap"] <= 2, "correct"].mean()
    long_ago = df.loc[df["gap"] >= 30, "correct"].mean()
    assert recent - long_ago > 0.05


def test_pivotal_skill(data):
    df = with_history(data[0])
    dep = df[df["skill_id"].isin(list(dependent_skills(20)))]
    unlocked = dep.loc[dep["pivot_hits_before"] >= 3, "correct"].mean()
    locked = dep.loc[dep["pivot_hits_before"] < 3, "correct"].mean()
    assert unlocked - locked > 0.15


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    cli_synth.add_arguments(p)
    return p.parse_args(argv)


def test_cli_writes_file_and_summary(tmp_path, capsys):
    out = tmp_path / "syn.csv"
    args = parse(["--out", str(out), "--learners", "12", "--seed", "9", "--min-len", "5", "--max-len", "20"])
    assert args.skills == 20 and args.questions == 200
    assert cli_synth.run(args) == 0
    line = capsys.readouterr().out.strip()
    assert "\n" not in line and "12 learners" in line and str(out) in line
    inter = read_interactions(out)
    assert inter.n_learners == 12 and f"{len(inter):,} interactions" in line
    assert read_interactions(out).question_id.tolist() == generate(12, 9, min_len=5, max_len=20)["question_id"].tolist()


def test_cli_defaults():
    args = parse(["--out", "x.csv"])
    assert (args.learners, args.seed, args.min_len, args.max_len) == (600, 7, 10, 300)
    assert (args.multi_skill, args.expanded) == (0.0, False)


def test_cli_multi_skill_expanded(tmp_path, capsys):
    out = tmp_path / "syn.csv"
    assert cli_synth.run(parse(["--out", str(out), "--learners", "8", "--multi-skill", "0.5", "--expanded"])) == 0
    line = capsys.readouterr().out.strip()
    assert f"{len(read_interactions(out)):,} rows" in line


def test_cli_bad_flag_is_a_one_line_error(tmp_path, capsys):
    code = cli.main(["synth", "--out", str(tmp_path / "x.csv"), "--learners", "0"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err == "routerkt synth: error: learners must be >= 1, got 0"
    assert not (tmp_path / "x.csv").exists()
