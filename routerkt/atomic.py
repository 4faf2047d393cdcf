"""Atomic file writes, used for everything others read (checkpoints, vocabularies, datasets, model
versions, reports): write a temporary file in the target's folder, fsync it, then os.replace, so a
reader sees the old file or the new one, never half of one. A failure removes the temporary file."""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_path(path: str | os.PathLike, mode: int = 0o644) -> Iterator[Path]:
    """Yield a temporary path next to `path`; after the block it replaces `path` (fsynced), with `mode`
    (0o600 for a secret: it is never readable by others, not even for a moment)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)                        # mkstemp's 0600 would carry over to the target
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes, mode: int = 0o644) -> None:
    with atomic_path(path, mode) as tmp:
        tmp.write_bytes(data)


def atomic_write_json(path: str | os.PathLike, obj: object, indent: int | None = 2) -> None:
    text = json.dumps(obj, indent=indent, separators=None if indent else (",", ":"))
    atomic_write_bytes(path, (text + "\n").encode("utf-8"))
