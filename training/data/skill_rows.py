"""Rows of one multi-skill interaction -> one interaction with the skill set (data.skill_rows).

Expanded files (assist2009's AKT/DKVMN lineage) write an interaction tagged with k skills as k
consecutive rows of one learner with the same question and the same answer, one skill per row. Read
as k interactions, the model sees the answer of the row it predicts in the row before: a leak.

The merge rule (`merge_rows`, the default `merge`): walking a learner's rows in order, a row joins
the interaction of the row before when it has the same learner, the same known question (not -1)
and the same answer, and none of its skills is already in that interaction's set; the set becomes
the union, in row order. A row repeating a skill already in the set is a retry (a new interaction),
as is a row with another answer. A merged set larger than MAX_SKILLS is an error naming the line.

`first_rows` (`first`, the former `collapse_repeats=true`) keeps each such run's first row only;
`expand` reads every row as an interaction (leaks; reproduces others' numbers). `apply` applies a
mode and records on the result how many rows it merged or dropped; `describe` says it in one line.
"""
from __future__ import annotations

import numpy as np

from routerkt.contract.signature import NO_SKILL
from training.config import SkillRows
from training.data.csv_reader import MAX_SKILLS, DataError, Interactions


def _continues(inter: Interactions) -> np.ndarray:
    """[N] bool: row i has the learner, known question and answer of row i-1 (row 0: False)."""
    same = ((inter.user_id[1:] == inter.user_id[:-1])
            & (inter.question_id[1:] == inter.question_id[:-1])
            & (inter.question_id[1:] != -1)
            & (inter.correct[1:] == inter.correct[:-1]))
    return np.r_[False, same]


def _disjoint_from_previous(sets: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """[len(rows)] bool: the set of row r shares no skill with the set of row r-1."""
    a, b = sets[rows], sets[rows - 1]
    hit = (a[:, :, None] == b[:, None, :]) & (a != NO_SKILL)[:, :, None]
    return ~hit.any(axis=(1, 2))


def _line(inter: Interactions, row: int) -> str:
    return str(inter.line[row]) if inter.line is not None else f"row {row + 1}"


def _too_many(inter: Interactions, row: int) -> DataError:
    return DataError(f"{inter.path}:{_line(inter, row)}: merging this row's skills into the interaction of the "
                     f"rows above (same learner, question and answer) gives more than {MAX_SKILLS} skills; "
                     f"split the interaction or read the rows as they are (data.skill_rows=expand)")


def _group_starts(inter: Interactions) -> np.ndarray:
    """[N] bool: row i starts a new interaction under the merge rule (module docstring)."""
    sets = inter.skill_id
    sizes = (sets != NO_SKILL).sum(axis=1)
    # a row with the very set of the row before is a retry: it starts an interaction just as a row
    # that continues nothing does (assist2017 has 335,819 retries; this keeps the loop below short)
    cont = _continues(inter)
    cont[1:] &= (sets[1:] != sets[:-1]).any(axis=1)
    start = ~cont
    rows = np.flatnonzero(cont)
    if rows.size == 0:
        return start
    # runs of continuing rows; a run of one row compares two sets (vectorised), longer runs go row by row
    run_start = rows[~cont[rows - 1]]
    last = rows[np.r_[rows[1:] != rows[:-1] + 1, True]]               # last row of each run
    run_end = last + 1
    one = run_end - run_start == 1
    single = run_start[one]
    joins = _disjoint_from_previous(sets, single)
    start[single] = ~joins
    over = single[joins & (sizes[single] + sizes[single - 1] > MAX_SKILLS)].tolist()[:1]
    for a, b in zip(run_start[~one].tolist(), run_end[~one].tolist()):
        current = set(sets[a - 1][: sizes[a - 1]].tolist())
        for r in range(a, b):
            skills = sets[r][: sizes[r]].tolist()
            if current.isdisjoint(skills):
                if len(current) + len(skills) > MAX_SKILLS:
                    over.append(r)
                    break
                current.update(skills)
            else:
                start[r] = True
                current = set(skills)
    if over:
        raise _too_many(inter, min(over))
    return start


def merge_rows(inter: Interactions) -> Interactions:
    """One interaction per run of rows under the merge rule (module docstring); the set is the union
    of the rows' sets in row order, K the largest merged set."""
    if len(inter) < 2:
        return inter
    start = _group_starts(inter)
    if start.all():
        return inter
    firsts, later = np.flatnonzero(start), np.flatnonzero(~start)
    sets = inter.skill_id
    sizes = (sets != NO_SKILL).sum(axis=1)
    group = np.searchsorted(firsts, later, side="right") - 1          # merged row -> its interaction
    before = np.cumsum(sizes) - sizes                                  # skills of earlier rows of the file
    offset = before[later] - before[firsts[group]]                     # slot of a merged row's first skill
    k = max(sets.shape[1], int((offset + sizes[later]).max()))
    out = np.full((firsts.size, k), NO_SKILL, dtype=np.int64)
    out[:, :sets.shape[1]] = sets[firsts]
    for j in range(sets.shape[1]):
        used = j < sizes[later]
        out[group[used], offset[used] + j] = sets[later[used], j]
    return Interactions(user_id=inter.user_id[firsts], question_id=inter.question_id[firsts], skill_id=out,
                        correct=inter.correct[firsts], path=inter.path,
                        line=inter.line[firsts] if inter.line is not None else None,
                        rows=_rows(inter), merged_rows=inter.merged_rows + len(inter) - firsts.size)


def first_rows(inter: Interactions) -> Interactions:
    """The former collapse_repeats: drop each row that repeats the previous row's learner, question
    (not -1) and answer with another skill set, keeping the first row (its skills only). Unlike the
    merge rule a retry of a skill seen two rows up is dropped too: exactly what the flag did
    (assist2009: 51,052 rows)."""
    if len(inter) < 2:
        return inter
    differs = np.r_[False, (inter.skill_id[1:] != inter.skill_id[:-1]).any(axis=1)]
    keep = ~(_continues(inter) & differs)
    if keep.all():
        return inter
    sets = inter.skill_id[keep]
    k = max(int((sets != NO_SKILL).sum(axis=1).max()), 1)
    return Interactions(user_id=inter.user_id[keep], question_id=inter.question_id[keep], skill_id=sets[:, :k],
                        correct=inter.correct[keep], path=inter.path,
                        line=inter.line[keep] if inter.line is not None else None,
                        rows=_rows(inter), merged_rows=inter.merged_rows + int((~keep).sum()))


def _rows(inter: Interactions) -> int:
    return inter.rows if inter.rows >= 0 else len(inter)


def apply(inter: Interactions, mode: SkillRows | str) -> Interactions:
    """`inter` read under `mode` (merge, first or expand)."""
    mode = SkillRows(mode)
    if mode is SkillRows.MERGE:
        return merge_rows(inter)
    if mode is SkillRows.FIRST:
        return first_rows(inter)
    return inter


def describe(inter: Interactions, mode: SkillRows | str) -> str:
    """One line on what `apply(.., mode)` did to the file's rows (for the training log)."""
    mode = SkillRows(mode)
    rows, n = _rows(inter), len(inter)
    if mode is SkillRows.MERGE and not inter.merged_rows:
        return (f"{inter.path}: {n:,} interactions, no rows of a multi-skill interaction to merge "
                f"(up to {inter.max_skills} skill(s) each; data.skill_rows=merge)")
    if mode is SkillRows.MERGE:
        return (f"{inter.path}: merged {inter.merged_rows:,} expanded multi-skill rows into their interactions "
                f"({rows:,} rows -> {n:,} interactions, up to {inter.max_skills} skills each; data.skill_rows=merge)")
    if mode is SkillRows.FIRST:
        return (f"{inter.path}: dropped {inter.merged_rows:,} expanded multi-skill rows, keeping each interaction's "
                f"first row and its skill ({rows:,} rows -> {n:,} interactions; data.skill_rows=first)")
    try:
        would = len(inter) - len(merge_rows(inter))
    except DataError:                                   # a run past MAX_SKILLS: expand reads it all the same
        would = int(_continues(inter).sum())
    tail = (f"; {would:,} of them repeat the row before under another skill and show the model the answer it "
            f"predicts (data.skill_rows=merge would merge them)") if would else ""
    return f"{inter.path}: {n:,} rows read as {n:,} interactions (data.skill_rows=expand){tail}"
