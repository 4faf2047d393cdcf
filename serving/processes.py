"""Process helpers shared by every part that starts a server (tritonserver, redis-server, gateways):
stopping a child (SIGTERM with a bounded wait, then SIGKILL) and picking a free loopback port.
Facts read from /proc (children, command lines, start times) live in serving/tritonserver/procfs.py."""
from __future__ import annotations

import signal
import socket
import subprocess

LOOPBACK = "127.0.0.1"


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


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port on `host` that was free a moment ago (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
