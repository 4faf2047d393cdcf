"""A local redis-server (or valkey-server) process on 127.0.0.1, for tests, benchmarks and
one-host demos: AOF on with `appendfsync always` (an acknowledged append is on disk), no RDB
snapshots, its data in a folder of the caller's. Stopped by PID (SIGTERM, then SIGKILL). Optionally
with ACL users (an aclfile of sha256 password hashes, mode 0600; the default user off) and TLS only
(`tls`: certificate, key, CA; the plaintext port closed)."""
from __future__ import annotations

import hashlib
import os
import shutil
import socket
import ssl
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

    def __init__(self, data_dir: Path, port: int | None = None, users: dict[str, tuple[str, str]] | None = None,
                 tls: tuple[Path, Path, Path] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None
        self.users = users or {}          # name -> (password, ACL rules such as redis_store.acl_rules())
        self.tls = tls                    # (certificate, key, CA) PEM files

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _security_args(self) -> list[str]:
        args: list[str] = []
        if self.users:
            acl = self.data_dir / "users.acl"
            lines = ["user default off"] + [
                f"user {name} on #{hashlib.sha256(password.encode()).hexdigest()} {rules}"
                for name, (password, rules) in self.users.items()]
            fd = os.open(acl, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write("\n".join(lines) + "\n")
            args += ["--aclfile", str(acl)]
        if self.tls:
            cert, key, ca = self.tls
            args += ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(cert),
                     "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no"]
        return args

    def _answers(self) -> bool:
        """The server answers PING (+PONG, or -NOAUTH when the default user is off)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as raw:
            sock = raw
            if self.tls:
                context = ssl.create_default_context(cafile=str(self.tls[2]))
                context.check_hostname = False
                sock = context.wrap_socket(raw)
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith((b"+PONG", b"-NOAUTH"))

    def start(self, timeout: float = 10.0) -> RedisServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [find_binary(), "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.data_dir),
                   "--save", "", "--appendonly", "yes", "--appendfsync", "always", "--protected-mode", "yes",
                   "--logfile", str(self.data_dir / "redis.log"), *self._security_args()]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise UserError(f"redis-server exited with code {self.process.returncode} "
                                f"(log: {self.data_dir / 'redis.log'})")
            try:
                if self._answers():
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
