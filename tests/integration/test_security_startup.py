"""Safe defaults of `routerkt serve`: a non-loopback --host without TLS or API keys refuses to start
with one line naming the flag (exit 2); --insecure starts and logs a warning."""
from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from serving.processes import free_port, terminate
from tests.helpers import wait_for
from tests.integration.security_helpers import make_ca, make_cert, stderr_until

pytestmark = pytest.mark.integration


def serve_command(repository, state_dir, *extra: str) -> list[str]:
    return [sys.executable, "-m", "routerkt.cli", "serve", "--repository", str(repository), "--host", "0.0.0.0",
            "--grpc-port", "0", "--http-port", "0", "--triton-url", f"127.0.0.1:{free_port()}", "--store", "none",
            "--state-dir", str(state_dir), "--log-format", "json", *extra]


@pytest.mark.parametrize("flags, named", [((), "--tls-cert"), (("tls",), "--api-keys")])
def test_a_public_bind_without_tls_or_keys_refuses_to_start(handmade_repository, tmp_path, flags, named) -> None:
    extra: list[str] = []
    if "tls" in flags:
        ca = make_ca(tmp_path, "ca")
        server = make_cert(tmp_path, ca, "server")
        extra = ["--tls-cert", str(server.cert), "--tls-key", str(server.key)]
    done = subprocess.run(serve_command(handmade_repository, tmp_path, *extra), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and "--insecure" in lines[0], done.stderr


def reachable(address: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(3)
        return sock.connect_ex((address, port)) == 0


def test_insecure_starts_and_says_so(handmade_repository, tmp_path) -> None:
    """... and with --host 0.0.0.0 both ports listen on the same address families (gRPC binds a
    dual-stack [::] socket for a wildcard host; the HTTP port does the same)."""
    process = subprocess.Popen(serve_command(handmade_repository, tmp_path, "--insecure"), stderr=subprocess.PIPE,
                               stdout=subprocess.DEVNULL, text=True)
    try:
        seen = stderr_until(process, "gateway started")
        assert any("INSECURE" in line and '"level": "warning"' in line for line in seen), "".join(seen)
        started = next((line for line in seen if "gateway started" in line), None)
        assert started is not None, "".join(seen)
        grpc_port, http_port = map(int, re.search(r"gRPC 0\.0\.0\.0:(\d+), HTTP 0\.0\.0\.0:(\d+)", started).groups())
        families = ["127.0.0.1"] + (["::1"] if Path("/proc/net/if_inet6").exists() and reachable_v6() else [])
        for address in families:                         # uvicorn listens a moment after the log line
            wait_for(lambda: reachable(address, grpc_port) and reachable(address, http_port), 10,
                     f"both ports on {address}")
    finally:
        terminate(process, timeout_s=15)


def reachable_v6() -> bool:
    """Whether this host has IPv6 loopback at all (else only IPv4 is checked)."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False
