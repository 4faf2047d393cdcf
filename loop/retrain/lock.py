"""One retrain at a time per model repository: an flock on a lock file inside it.

The lock file names its holder (pid, host, since)."""
from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from routerkt.errors import UserError

LOCK_FILE = ".retrain.lock"      # hidden: the repository readers skip dot names, Triton loads folders only


def _holder(path: Path) -> str:
    try:
        who = json.loads(path.read_text() or "{}")
        return f"pid {who.get('pid')} on host {who.get('host')} since {who.get('since')}"
    except (OSError, ValueError):
        return "an unknown process"


@contextmanager
def retrain_lock(repository: Path) -> Iterator[Path]:
    """Hold the repository's retrain lock for the block; UserError at once when another process holds it.
    The kernel releases an flock when its holder dies, so a crashed retrain never blocks the next one."""
    repository = Path(repository)
    if not repository.is_dir():
        raise UserError(f"--repository {repository}: no such model repository")
    path = repository / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise UserError(f"the repository {repository} is not writable ({exc.strerror})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"another retrain holds the lock of {repository}: {_holder(path)}") from None
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since}).encode(), 0)
        yield path
    finally:
        os.close(fd)                # releases the flock; the file stays (its content names the last holder)
