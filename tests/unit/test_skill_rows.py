"""Tests of training/data/skill_rows.py: the merge rule of multi-skill rows, its overrides and counts,
and the former `collapse_repeats` flag in recorded configs and --set."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from routerkt.contract.signature import NO_SKILL
from training.config import DataConfig, RunConfig, SkillRows, apply_overrides, from_dict, to_dict
from training.data.csv_reader import MAX_SKILLS, DataError, Interactions, read_interactions
from training.data.skill_rows import apply, describe, first_rows, merge_rows

pytestmark = pytest.mark.unit

H = "user_id,order,question_id,skill_id,correct\n"
X = NO_SKILL


def read(tmp_path: Path, rows: list[str]) -> Interactions:
    path = tmp_path / "data.csv"
    path.write_text(H + "\n".join(rows) + "\n")
    return read_interactions(path)


ROWS = [
    "1,0,10,3,1", "1,1,10,4,1", "1,2,10,5,1",  # one problem with 3 skills, expanded -> 1 interaction {3,4,5}
    "1,3,10,5,1",                              # the same question, answer and a skill of the set: a retry
    "1,5,11,3,0", "1,6,11,4,1",                # another answer: two interactions
    "1,7,-1,3,1", "1,8,-1,4,1",                # unknown question: never merged
    "2,0,11,4,1",                              # next learner, same question as the row before: kept
]


def test_merge_rule(tmp_path):
    inter = read(tmp_path, ROWS)
    out = merge_rows(inter)
    assert out.skill_id.tolist() == [[3, 4, 5], [5, X, X], [3, X, X], [4, X, X], [3, X, X], [4, X, X], [4, X, X]]
    assert out.question_id.tolist() == [10, 10, 11, 11, -1, -1, 11]
    assert out.user_id.tolist() == [1, 1, 1, 1, 1, 1, 2]
    assert out.correct.tolist() == [1, 1, 0, 1, 1, 1, 1] and out.correct.dtype == np.int8
    assert out.line.tolist() == [2, 5, 6, 7, 8, 9, 10]            # each interaction's first row
    assert (out.rows, out.merged_rows, len(out), out.max_skills) == (9, 2, 7, 3)
    assert out.path == inter.path
    assert out.segments()[2].tolist() == [6, 1]


def test_retry_after_a_merged_set_starts_again(tmp_path):
    # q 6: {4, 9}, then 4 again (a retry) -> {4, 9} once more; sets from a ";" field merge like rows
    rows = ["1,0,6,4,0", "1,1,6,9,0", "1,2,6,4,0", "1,3,6,9,0", "1,4,7,3;17,1", "1,5,7,5,1", "1,6,7,17;8,1"]
    out = merge_rows(read(tmp_path, rows))
    assert out.skill_id.tolist() == [[4, 9, X], [4, 9, X], [3, 17, 5], [17, 8, X]]
    assert out.merged_rows == 3


def test_identical_rows_stay(tmp_path):
    inter = read(tmp_path, ["1,0,6,4,1", "1,1,6,4,1", "1,2,6,4,1"])
    out = merge_rows(inter)
    assert len(out) == 3 and out.merged_rows == 0 and out.max_skills == 1


def test_overrides(tmp_path):
    inter = read(tmp_path, ROWS)
    expanded = apply(inter, SkillRows.EXPAND)                      # the old default: one interaction per row
    assert expanded is inter and len(expanded) == 9 and expanded.merged_rows == 0
    first = apply(inter, "first")                                   # the former collapse_repeats=true
    assert first.skill_id[:, 0].tolist() == [3, 5, 3, 4, 3, 4, 4] and first.max_skills == 1
    assert (first.rows, first.merged_rows) == (9, 2)
    assert apply(inter, "merge").skill_id.tolist() == merge_rows(inter).skill_id.tolist()


def test_describe_counts(tmp_path):
    inter = read(tmp_path, ROWS)
    assert "merged 2 expanded multi-skill rows into their interactions (9 rows -> 7 interactions, up to 3 skills" \
        in describe(merge_rows(inter), "merge")
    assert "dropped 2 expanded multi-skill rows" in describe(first_rows(inter), "first")
    line = describe(inter, "expand")
    assert "9 rows read as 9 interactions" in line and "2 of them repeat the row before" in line
    assert "\n" not in line
    single = read(tmp_path, ["1,0,6,4,1", "1,1,7,4,1"])
    assert "no rows of a multi-skill interaction to merge" in describe(merge_rows(single), "merge")


def test_too_many_skills_after_merging_names_the_line(tmp_path):
    rows = [f"1,{i},6,{i},1" for i in range(MAX_SKILLS + 1)]
    with pytest.raises(DataError) as info:
        merge_rows(read(tmp_path, rows))
    assert str(info.value).startswith(f"{tmp_path / 'data.csv'}:{MAX_SKILLS + 2}: merging this row's skills")
    assert len(merge_rows(read(tmp_path, rows[:MAX_SKILLS])).skill_id[0]) == MAX_SKILLS
    assert "17 rows read as 17 interactions" in describe(read(tmp_path, rows), "expand")   # expand reads them


def _reference(user, q, sets, correct):
    """The merge rule row by row, as the module docstring states it."""
    out = []
    for u, qq, ss, c in zip(user, q, sets, correct):
        skills = [s for s in ss if s != NO_SKILL]
        last = out[-1] if out else None
        if last and last[0] == u and last[1] == qq and qq != -1 and last[3] == c and not set(last[2]) & set(skills):
            last[2].extend(skills)
        else:
            out.append([u, qq, skills, c])
    return out


def test_matches_a_row_by_row_reference():
    rng = np.random.default_rng(0)
    n = 3000
    sets = np.full((n, 2), NO_SKILL)
    sets[:, 0] = rng.integers(-1, 4, n)
    two = rng.random(n) < 0.2
    sets[two, 1] = sets[two, 0] + 5
    inter = Interactions(user_id=np.sort(rng.integers(0, 40, n)), question_id=rng.integers(-1, 2, n),
                         skill_id=sets, correct=rng.integers(0, 2, n).astype(np.int8))
    out = merge_rows(inter)
    ref = _reference(inter.user_id, inter.question_id, inter.skill_id, inter.correct)
    assert len(out) == len(ref) and out.merged_rows == n - len(ref) > 100
    assert out.user_id.tolist() == [r[0] for r in ref] and out.question_id.tolist() == [r[1] for r in ref]
    assert out.correct.tolist() == [r[3] for r in ref]
    assert [[s for s in row if s != NO_SKILL] for row in out.skill_id.tolist()] == [r[2] for r in ref]


def test_recorded_collapse_repeats_loads_as_what_it_did():
    assert DataConfig().skill_rows is SkillRows.MERGE
    record = to_dict(RunConfig())
    del record["data"]["skill_rows"]
    for old, mapped in ((True, SkillRows.FIRST), (False, SkillRows.EXPAND)):
        record["data"]["collapse_repeats"] = old
        assert from_dict(RunConfig, record).data.skill_rows is mapped
    record["data"]["skill_rows"] = "merge"
    with pytest.raises(ValueError, match="contradicts"):
        from_dict(RunConfig, record)


def test_set_collapse_repeats_maps_to_skill_rows():
    assert apply_overrides(RunConfig(), ["data.collapse_repeats=true"]).data.skill_rows is SkillRows.FIRST
    assert apply_overrides(RunConfig(), ["data.collapse_repeats=false"]).data.skill_rows is SkillRows.EXPAND
    assert apply_overrides(RunConfig(), ["data.skill_rows=expand"]).data.skill_rows is SkillRows.EXPAND
    with pytest.raises(ValueError, match="merge, first, expand"):
        apply_overrides(RunConfig(), ["data.skill_rows=off"])


def test_results_configs_still_load():
    import json
    root = Path(__file__).resolve().parents[2] / "results"
    configs = sorted(root.rglob("config.json"))
    assert configs
    for path in configs:
        cfg = from_dict(RunConfig, json.loads(path.read_text()))
        assert isinstance(cfg.data.skill_rows, SkillRows)


@pytest.mark.dataset
def test_assist2009_merge_counts():
    from tests.conftest import dataset
    inter = read_interactions(dataset("assist2009"))
    merged = merge_rows(inter)
    assert (len(inter), len(merged), merged.merged_rows, merged.max_skills) == (325_637, 274_590, 51_047, 4)
    # the former collapse_repeats drops 5 more: retries of a skill two rows up after another skill
    assert len(first_rows(inter)) == 325_637 - 51_052
