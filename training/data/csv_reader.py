"""Reader for the canonical interaction CSV, `user_id,order,question_id,skill_id,correct`.

`read_interactions(path)` parses a plain or gzip-compressed file with pandas, validates it, and
returns `Interactions`: columnar numpy arrays in file order. Validation is vectorised; when the file
has problems, the error names the FIRST offending line (1-based, the header is line 1) and the
problem, e.g. `data.csv:17: column 'correct' must be 0 or 1, got 2`. Whole-file problems read
`data.csv: <problem>`.

Rules: the five columns must exist (any order; extra columns are ignored); every value in them is an
integer (integral floats such as `3.0` are accepted); `user_id >= 0`; `question_id`, `skill_id >= -1`
(-1 = unknown); `correct` in {0, 1}; the rows of one user are contiguous and their `order` strictly
increases. Error messages cite line numbers, never learner ids.

pandas is imported only when a file is read, so `DataError` and `Interactions` (and the vocabulary,
which the serving gateway imports) need numpy alone.

Compression: a name ending in `.gz` is read as gzip (and must be gzip); a file that starts with the
gzip magic bytes is also read as gzip whatever its name.

`collapse_repeats` merges the consecutive duplicated rows that multi-skill problems produce in
assist2009 (one row per skill, same problem and answer, another skill), keeping the first row.
"""
from __future__ import annotations

import gzip
import os
import re
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from routerkt.errors import UserError

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = ("user_id", "order", "question_id", "skill_id", "correct")
GZIP_MAGIC = b"\x1f\x8b"
_INT64_LIMIT = 2.0**63


class DataError(UserError):
    """A data file is missing or malformed; str(error) is `<path>[:<line>]: <problem>`."""


@dataclass
class Interactions:
    """All interactions of a file, one entry per row, in file order (grouped by user, then order)."""

    user_id: np.ndarray      # int64 [N] raw learner id
    question_id: np.ndarray  # int64 [N] raw question id, -1 = unknown
    skill_id: np.ndarray     # int64 [N] raw skill id, -1 = unknown
    correct: np.ndarray      # int8  [N] 0/1
    path: str = ""
    _segments: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(
        default=None, init=False, repr=False, compare=False)

    def __len__(self) -> int:
        return int(self.user_id.shape[0])

    def segments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(user ids, start rows, lengths) of each learner's contiguous block, in file order; int64 arrays."""
        if self._segments is None:
            n = len(self)
            if n == 0:
                empty = np.zeros(0, dtype=np.int64)
                self._segments = (empty, empty, empty)
            else:
                starts = np.flatnonzero(np.r_[True, self.user_id[1:] != self.user_id[:-1]]).astype(np.int64)
                lengths = np.diff(np.r_[starts, n]).astype(np.int64)
                self._segments = (self.user_id[starts].astype(np.int64), starts, lengths)
        return self._segments

    def learner_slices(self) -> list[tuple[int, slice]]:
        """(user id, row slice) per learner, in file order."""
        users, starts, lengths = self.segments()
        return [(int(u), slice(int(s), int(s + n))) for u, s, n in zip(users, starts, lengths)]

    @property
    def n_learners(self) -> int:
        return int(self.segments()[0].shape[0])


# ----------------------------------------------------------------------------------------------
# Reading

def _open_error(path: Path) -> str | None:
    """A whole-file problem found before parsing (missing, empty, a .gz that is not gzip), or None."""
    if not path.exists():
        return "no such file"
    if path.is_dir():
        return "is a directory, expected a CSV file"
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
    except OSError as exc:
        return f"cannot read ({exc.strerror or exc})"
    if not head:
        return "empty file"
    if path.name.endswith(".gz") and head != GZIP_MAGIC:
        return "not a gzip file (the name ends in .gz but the content is not gzip-compressed)"
    return None


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == GZIP_MAGIC


def _parse(path: Path) -> pd.DataFrame:
    """pandas parse with pandas' errors turned into DataError; every column as pandas infers it."""
    import pandas as pd  # imported here: the serving gateway imports DataError/vocab without pandas

    where = str(path)
    compression = "gzip" if _is_gzip(path) else None
    try:
        with warnings.catch_warnings():
            # a first data row with more fields than the header only warns under index_col=False
            warnings.simplefilter("error", pd.errors.ParserWarning)
            return pd.read_csv(path, compression=compression, index_col=False, skip_blank_lines=False,
                               keep_default_na=False, na_values=[""], low_memory=False,
                               encoding="utf-8")
    except pd.errors.EmptyDataError:
        raise DataError(f"{where}: empty file") from None
    except pd.errors.ParserWarning:
        raise DataError(f"{where}:2: more fields than the header has") from None
    except pd.errors.ParserError as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else "malformed CSV"
        found = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", msg)
        if found:
            expected, line, saw = found.groups()
            raise DataError(f"{where}:{line}: {saw} fields, but the header has {expected}") from None
        raise DataError(f"{where}: malformed CSV ({msg})") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}: not UTF-8 text ({exc.reason})") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise DataError(f"{where}: corrupt or truncated gzip file ({exc})") from None
    except OSError as exc:
        raise DataError(f"{where}: cannot read ({exc})") from None


def _first_line(path: Path) -> str:
    opener = gzip.open if _is_gzip(path) else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
        return fh.readline().rstrip("\r\n")


def _describe(value: object) -> str:
    if isinstance(value, float):
        return format(value, "g")
    return repr(value) if isinstance(value, str) else str(value)


def _to_int64(col: pd.Series, k: int, problems: list[tuple[int, int, int, str]]) -> np.ndarray:
    """Column k -> int64; its first row that is not an integer is recorded in `problems`; bad rows become 0."""
    import pandas as pd

    name = COLUMNS[k]
    if col.dtype == np.int64:
        return col.to_numpy()
    if col.dtype.kind == "b":  # true/false is not an integer
        ok = np.zeros(len(col), dtype=bool)
        values = np.zeros(len(col), dtype=np.int64)
    elif col.dtype.kind in "iu":  # uint64 beyond int64's range (pandas picks uint64 for huge values)
        exact = col.to_numpy()
        ok = exact <= np.iinfo(np.int64).max
        values = np.where(ok, exact, 0).astype(np.int64)
    else:
        numeric = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        ok = np.isfinite(numeric) & (np.abs(numeric) < _INT64_LIMIT)
        safe = np.where(ok, numeric, 0.0)
        ok &= np.floor(safe) == safe
        values = np.where(ok, safe, 0.0).astype(np.int64)
    bad = np.flatnonzero(~ok)
    if bad.size:
        i = int(bad[0])
        raw = col.iloc[i]
        if isinstance(raw, float) and np.isnan(raw):
            problems.append((i, 0, k, f"missing value in column '{name}'"))
        elif name == "correct":
            problems.append((i, 0, k, f"column 'correct' must be 0 or 1, got {_describe(raw)}"))
        else:
            problems.append((i, 0, k, f"column '{name}' must hold integers, got {_describe(raw)}"))
        values[~ok] = 0
    return values


def _first(mask: np.ndarray) -> int | None:
    idx = np.flatnonzero(mask)
    return int(idx[0]) if idx.size else None


def _check_values(cols: dict[str, np.ndarray], lines: np.ndarray,
                  problems: list[tuple[int, int, int, str]]) -> None:
    """Range and structure checks; each check records its first offending row.

    Rows that failed to parse hold placeholder values; any complaint those cause sits at or after the
    row's parse problem, which has a lower priority number and therefore wins.
    """
    user, order, q, s, c = (cols[k] for k in COLUMNS)
    checks = [
        (user < 0, 0, "column 'user_id' must be >= 0, got {}", user),
        (q < -1, 2, "column 'question_id' must be >= 0 or -1 (unknown), got {}", q),
        (s < -1, 3, "column 'skill_id' must be >= 0 or -1 (unknown), got {}", s),
        ((c != 0) & (c != 1), 4, "column 'correct' must be 0 or 1, got {}", c),
    ]
    for mask, k, text, values in checks:
        i = _first(mask)
        if i is not None:
            problems.append((i, 1, k, text.format(values[i])))
    n = user.shape[0]
    if n < 2:
        return
    same_user = user[1:] == user[:-1]
    # order strictly increasing inside a user
    i = _first(same_user & (order[1:] <= order[:-1]))
    if i is not None:
        problems.append((i + 1, 2, 1, f"unsorted order: {order[i + 1]} is not greater than {order[i]} "
                                   f"on the previous line of the same user"))
    # each user's rows contiguous: every block start must be that user's first block
    starts = np.flatnonzero(np.r_[True, ~same_user])
    _, first_block = np.unique(user[starts], return_index=True)
    repeated = np.ones(starts.shape[0], dtype=bool)
    repeated[first_block] = False
    j = _first(repeated)
    if j is not None:
        row = int(starts[j])
        earlier = int(starts[np.flatnonzero(user[starts] == user[row])[0]])
        problems.append((row, 2, 0, f"rows of one user are not contiguous: this user_id also appears from "
                                    f"line {lines[earlier]}; keep each user's rows together"))


def read_interactions(path: str | os.PathLike) -> Interactions:
    """Read and validate a canonical interaction CSV (plain or .gz); raises DataError on any problem.

    Blank lines are skipped (line numbers in errors still count them).
    """
    p = Path(path)
    where = str(p)
    problem = _open_error(p)
    if problem:
        raise DataError(f"{where}: {problem}")
    df = _parse(p)
    df.columns = [str(c).strip() for c in df.columns]
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise DataError(f"{where}: missing column(s) {', '.join(missing)} (line 1 is {_first_line(p)[:80]!r}; "
                        f"expected a header {','.join(COLUMNS)})")
    lines = np.arange(2, len(df) + 2, dtype=np.int64)  # row -> line in the file (header = line 1)
    blank = df.isna().all(axis=1).to_numpy()
    if blank.any():
        df, lines = df.loc[~blank], lines[~blank]
    if len(df) == 0:
        raise DataError(f"{where}: no data rows (header only)")
    problems: list[tuple[int, int, int, str]] = []  # (row, check stage, column, message); min = first
    cols = {name: _to_int64(df[name], k, problems) for k, name in enumerate(COLUMNS)}
    _check_values(cols, lines, problems)
    if problems:
        row, _, _, text = min(problems)
        raise DataError(f"{where}:{lines[row]}: {text}")
    return Interactions(user_id=cols["user_id"], question_id=cols["question_id"], skill_id=cols["skill_id"],
                        correct=cols["correct"].astype(np.int8), path=where)


def collapse_repeats(inter: Interactions) -> Interactions:
    """Drop each row that repeats the previous row's learner, question (not -1) and answer with another skill.

    assist2009 (AKT/DKVMN lineage) writes a problem tagged with k skills as k consecutive rows with the
    same problem and answer, one per skill; this keeps the first of them (its first skill): 51,052 rows
    of assist2009 go. The skill must differ so that genuine repeated attempts (same question, same
    skill; assist2017 has 335,819 of them) stay.
    """
    if len(inter) < 2:
        return inter
    repeat = ((inter.user_id[1:] == inter.user_id[:-1])
              & (inter.question_id[1:] == inter.question_id[:-1])
              & (inter.question_id[1:] != -1)
              & (inter.correct[1:] == inter.correct[:-1])
              & (inter.skill_id[1:] != inter.skill_id[:-1]))
    keep = np.r_[True, ~repeat]
    return Interactions(user_id=inter.user_id[keep], question_id=inter.question_id[keep],
                        skill_id=inter.skill_id[keep], correct=inter.correct[keep], path=inter.path)
