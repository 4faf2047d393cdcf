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

Skill sets: `skill_id` may name several skills of one interaction separated by ";" (`3;17`), each
>= -1, none twice, at most MAX_SKILLS. `Interactions.skill_id` is always a set array [N, K]: K is the
largest set of the file (1 for single-skill files, read exactly as before), unused slots NO_SKILL
(-2, routerkt/contract/signature.py). Rows of one multi-skill interaction written one per skill are
merged by training/data/skill_rows.py, not here.

pandas is imported only when a file is read, so `DataError` and `Interactions` (and the vocabulary,
which the serving gateway imports) need numpy alone.

Compression: a name ending in `.gz` is read as gzip (and must be gzip); a file that starts with the
gzip magic bytes is also read as gzip whatever its name.
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

from routerkt.contract.signature import NO_SKILL
from routerkt.errors import UserError

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = ("user_id", "order", "question_id", "skill_id", "correct")
GZIP_MAGIC = b"\x1f\x8b"
SKILL_SEP = ";"            # separates the skills of one interaction in a `skill_id` field
MAX_SKILLS = 16            # most skills one interaction may carry (a field, or rows merged into one)
_INT64_LIMIT = 2.0**63


class DataError(UserError):
    """A data file is missing or malformed; str(error) is `<path>[:<line>]: <problem>`."""


@dataclass
class Interactions:
    """All interactions of a file in file order (grouped by user, then order): one per row as read,
    fewer once the rows of multi-skill interactions are merged (training/data/skill_rows.py)."""

    user_id: np.ndarray      # int64 [N] raw learner id
    question_id: np.ndarray  # int64 [N] raw question id, -1 = unknown
    skill_id: np.ndarray     # int64 [N, K] raw skill set, -1 = unknown skill, NO_SKILL in unused slots
    correct: np.ndarray      # int8  [N] 0/1
    path: str = ""
    line: np.ndarray | None = None  # int64 [N] file line of each interaction's (first) row, for messages
    rows: int = -1           # data rows of the file (-1: len(self), nothing merged)
    merged_rows: int = 0     # rows merged into (or dropped for) the interaction of an earlier row
    _segments: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(
        default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if np.ndim(self.skill_id) == 1:                 # one skill per interaction, given as [N]
            self.skill_id = np.asarray(self.skill_id).reshape(-1, 1)

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

    @property
    def max_skills(self) -> int:
        """K: the largest skill set of an interaction."""
        return int(self.skill_id.shape[1])


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


def _to_skill_sets(col: pd.Series, problems: list[tuple[int, int, int, str]]) -> tuple[np.ndarray, np.ndarray]:
    """The skill column -> (ids [N, K] with NO_SKILL in unused slots, skills per row [N]); a column
    without SKILL_SEP is read exactly as the other columns (K = 1)."""
    import pandas as pd

    k = COLUMNS.index("skill_id")
    text_column = col.dtype.kind not in "iufb"                          # str / object: may hold ";"
    multi = (col.str.contains(SKILL_SEP, regex=False, na=False).to_numpy(dtype=bool)
             if text_column else np.zeros(len(col), dtype=bool))
    if not multi.any():
        return _to_int64(col, k, problems)[:, None], np.ones(len(col), dtype=np.int64)
    parts = col.str.split(SKILL_SEP, expand=True)                       # [N, K]; None beyond a row's fields
    present = parts.notna().to_numpy()
    present[~multi, 0] = True                                           # a missing value is reported below
    counts = present.sum(axis=1).astype(np.int64)
    ids = np.full(parts.shape, NO_SKILL, dtype=np.int64)
    bad = np.zeros(len(col), dtype=bool)
    for j in range(parts.shape[1]):
        piece = parts[j].where(present[:, j], None)
        text = piece.astype(str).str.strip()
        numeric = pd.to_numeric(text.where(present[:, j], "0"), errors="coerce").to_numpy(dtype=np.float64,
                                                                                       na_value=np.nan)
        ok = np.isfinite(numeric) & (np.abs(numeric) < _INT64_LIMIT)
        safe = np.where(ok, numeric, 0.0)
        ok &= np.floor(safe) == safe
        ok &= ~(present[:, j] & multi & (text == "").to_numpy())
        bad |= present[:, j] & ~ok
        ids[:, j] = np.where(present[:, j] & ok, safe, NO_SKILL).astype(np.int64)
    i = _first(bad)
    if i is not None:
        raw = col.iloc[i]
        if isinstance(raw, float) and np.isnan(raw):
            problems.append((i, 0, k, "missing value in column 'skill_id'"))
        elif multi[i]:
            problems.append((i, 0, k, f"column 'skill_id' must hold integers separated by '{SKILL_SEP}', "
                                      f"got {_describe(raw)}"))
        else:
            problems.append((i, 0, k, f"column 'skill_id' must hold integers, got {_describe(raw)}"))
    return ids, counts


def _check_sets(ids: np.ndarray, counts: np.ndarray, problems: list[tuple[int, int, int, str]]) -> None:
    """Each id of a set >= -1, none twice in one field, at most MAX_SKILLS per field."""
    k = COLUMNS.index("skill_id")
    used = np.arange(ids.shape[1])[None, :] < counts[:, None]
    i = _first((used & (ids < -1)).any(axis=1))
    if i is not None:
        bad = ids[i][used[i] & (ids[i] < -1)][0]
        problems.append((i, 1, k, f"column 'skill_id' must be >= 0 or -1 (unknown), got {bad}"))
    if ids.shape[1] > 1:
        ordered = np.sort(np.where(used, ids, NO_SKILL - 1 - np.arange(ids.shape[1])[None, :]), axis=1)
        i = _first((ordered[:, 1:] == ordered[:, :-1]).any(axis=1))
        if i is not None:
            twice = ordered[i][1:][ordered[i][1:] == ordered[i][:-1]][0]
            field = SKILL_SEP.join(str(s) for s in ids[i][used[i]])
            problems.append((i, 1, k, f"column 'skill_id' names skill {twice} twice in '{field}'"))
    i = _first(counts > MAX_SKILLS)
    if i is not None:
        problems.append((i, 1, k, f"column 'skill_id' holds {counts[i]} skills, at most {MAX_SKILLS} are allowed"))


def _first(mask: np.ndarray) -> int | None:
    idx = np.flatnonzero(mask)
    return int(idx[0]) if idx.size else None


def _check_values(cols: dict[str, np.ndarray], lines: np.ndarray,
                  problems: list[tuple[int, int, int, str]]) -> None:
    """Range and structure checks; each check records its first offending row.

    Rows that failed to parse hold placeholder values; any complaint those cause sits at or after the
    row's parse problem, which has a lower priority number and therefore wins.
    """
    user, order, q, c = (cols[k] for k in ("user_id", "order", "question_id", "correct"))
    checks = [
        (user < 0, 0, "column 'user_id' must be >= 0, got {}", user),
        (q < -1, 2, "column 'question_id' must be >= 0 or -1 (unknown), got {}", q),
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
    cols = {name: _to_int64(df[name], k, problems) for k, name in enumerate(COLUMNS) if name != "skill_id"}
    skills, counts = _to_skill_sets(df["skill_id"], problems)
    _check_values(cols, lines, problems)
    _check_sets(skills, counts, problems)
    if problems:
        row, _, _, text = min(problems)
        raise DataError(f"{where}:{lines[row]}: {text}")
    return Interactions(user_id=cols["user_id"], question_id=cols["question_id"], skill_id=skills,
                        correct=cols["correct"].astype(np.int8), path=where, line=lines, rows=len(lines))

