"""Reading one JSON artifact (vocab.json, model_info.json) with errors that name the file and line."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def read_json(path: str | os.PathLike, error: type[Exception]) -> Any:
    """The parsed content of `path`; raises `error("<path>: <problem>")` when missing or malformed."""
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{where}: cannot read ({exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{where}:{exc.lineno}: invalid JSON ({exc.msg}, column {exc.colno})") from None
