"""Stopping a child process this program started: SIGTERM with a bounded wait, then SIGKILL."""
from __future__ import annotations

import signal
import subprocess


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
