"""Child processes this program started: stopping one (SIGTERM with a bounded wait, then SIGKILL),
and finding its children (Linux /proc), for tests and benchmarks that kill a part on purpose."""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path


def terminate(process: subprocess.Popen | None, timeout_s: float = 20.0) -> None:
    """SIGTERM, wait up to `timeout_s`, then SIGKILL; nothing when it already exited."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill(process)


def kill(process: subprocess.Popen | None) -> None:
    """SIGKILL (a crash, in tests) and reap it."""
    if process is not None and process.poll() is None:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)


def children(pid: int) -> list[int]:
    """PIDs whose parent is `pid` (Linux /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
