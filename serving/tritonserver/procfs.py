"""Facts about processes by PID, read from /proc: children, command line, start time, liveness, mapped files.

A PID alone can be reused; a (PID, start time) pair names one process, which is how the Triton
launcher and its watchdog (serving/tritonserver/launcher.py, serving/tritonserver/watchdog.py) decide what is
theirs to signal. Linux only.
"""
from __future__ import annotations

import os
import time
from typing import Sequence


def children(pid: int) -> list[int]:
    """Direct children of `pid`, from /proc/<p>/stat (field 4 is the parent PID)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1 and fields[1] == str(pid):
            found.append(int(entry))
    return found


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state first), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()


def start_time(pid: int) -> str | None:
    """The process start time in clock ticks (stat field 22): with the PID it names one process."""
    fields = stat_fields(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def wait_gone(pids: dict[int, str], timeout: float) -> None:
    """Wait (bounded) until none of `pids` (PID -> start time) is alive; zombies count as gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p, s) for p, s in pids.items()):
        time.sleep(0.05)


def alive(pid: int, start: str) -> bool:
    """True while the process `pid` that started at `start` exists and is not a zombie. The start
    time, not the command line, identifies it: a process in the middle of exiting has already
    dropped its command line, and a reused PID has another start time."""
    fields = stat_fields(pid)
    return fields is not None and len(fields) > 19 and fields[19] == start \
        and fields[0] not in ("Z", "X")


def mapped_files(pids: Sequence[int], prefix: str) -> set[str]:
    """The files under `prefix` that the processes `pids` map (from /proc/<p>/maps; deleted ones left out)."""
    found: set[str] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:              # addr perms offset dev inode [path]
                    parts = line.rstrip("\n").split(None, 5)
                    if len(parts) == 6 and parts[5].startswith(prefix) and not parts[5].endswith(" (deleted)"):
                        found.add(parts[5])
        except OSError:
            continue
    return found
