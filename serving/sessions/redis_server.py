"""A local redis-server (or valkey-server) process on 127.0.0.1, for tests, benchmarks and
one-host demos: AOF on with `appendfsync always` (an acknowledged append is on disk), no RDB
snapshots, its data in a folder of the caller's. Stopped by PID (SIGTERM, then SIGKILL)."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from routerkt.errors import UserError
from serving.processes import kill, terminate
from serving.processes import free_port

BINARIES = ("redis-server", "valkey-server")


def find_binary() -> str:
    for name in BINARIES:
        path = shutil.which(name)
        if path:
            return path
    raise UserError("no redis-server or valkey-server on PATH (`make install` installs Debian's redis-server)")


class RedisServer:
    """One redis-server process; `url` is what `routerkt serve --store` takes."""

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [find_binary(), "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.data_dir),
                   "--save", "", "--appendonly", "yes", "--appendfsync", "always", "--protected-mode", "yes",
                   "--logfile", str(self.data_dir / "redis.log")]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise UserError(f"redis-server exited with code {self.process.returncode} "
                                f"(log: {self.data_dir / 'redis.log'})")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise UserError(f"redis-server did not answer on port {self.port} within {timeout:.0f}s")

    def kill(self) -> None:
        """SIGKILL (a crash): whatever was acknowledged is in the AOF."""
        kill(self.process)

    def stop(self) -> None:
        terminate(self.process, timeout_s=10)
        self.process = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
