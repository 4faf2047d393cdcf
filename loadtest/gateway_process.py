"""`routerkt serve` as a child process on loopback, for the benchmarks and the e2e tests that need a
gateway in its own process (kill -9, restarts, several gateways, a profiler-free process of its own).

    gateway = GatewayProcess(repository, folder, ["--triton-url", url, "--store", "none"]).start()
    gateway.wait_serving()              # gRPC health SERVING for every service asked
    ...; gateway.metric("routerkt_triton_replica_inferences_total", replica="0")
    gateway.kill()  /  gateway.stop()   # SIGKILL / SIGTERM then SIGKILL, by PID
    gateway.start()                     # again, on the same ports (a restarted gateway)

Ports are picked once; each start appends to its own log (`gateway-<grpc port>-<start>.log` in
`folder`). `env` adds variables (e.g. the session-key secret).

`stop_children_on_sigterm(stack)`: a benchmark that starts servers under an ExitStack turns SIGTERM
into KeyboardInterrupt while the stack is open, so the stack's callbacks stop what it started.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Sequence

from serving.processes import kill, terminate

ROUTERKT = [sys.executable, "-m", "routerkt.cli"]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def stop_children_on_sigterm(stack: ExitStack) -> None:
    """SIGTERM raises KeyboardInterrupt until `stack` closes (then the old handler is back)."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    stack.callback(signal.signal, signal.SIGTERM, previous)


class GatewayProcess:
    def __init__(self, repository: Path, folder: Path, args: Sequence[str] = (), env: dict[str, str] | None = None,
                 http: bool = True) -> None:
        from serving.processes import free_port

        self.repository, self.folder, self.args = Path(repository), Path(folder), list(args)
        self.env = {**os.environ, **(env or {})}
        self.grpc_port = free_port()
        self.http_port = free_port() if http else -1
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self.folder.mkdir(parents=True, exist_ok=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def log(self) -> Path:
        return self.folder / f"gateway-{self.grpc_port}-{self.starts}.log"

    def start(self) -> GatewayProcess:
        self.starts += 1
        command = [*ROUTERKT, "serve", "--repository", str(self.repository), "--grpc-port", str(self.grpc_port),
                   "--http-port", str(self.http_port), "--state-dir", str(self.folder / "state"),
                   "--log-format", "json", "--grace-period", "2", *self.args]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self.env,
                                            start_new_session=True)
        return self

    def wait_serving(self, services: Sequence[str] = ("",), timeout: float = 180.0) -> GatewayProcess:
        """Every gRPC health service in `services` says SERVING (bounded); AssertionError otherwise."""
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        deadline = time.monotonic() + timeout
        with grpc.insecure_channel(self.address, options=[("grpc.enable_http_proxy", 0)]) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                if self.process is None or self.process.poll() is not None:
                    raise AssertionError(f"gateway {self.address} exited:\n{self.tail()}")
                try:
                    statuses = [health.Check(health_pb2.HealthCheckRequest(service=s), timeout=1.0).status
                                for s in services]
                    if statuses == [health_pb2.HealthCheckResponse.SERVING] * len(services):
                        return self
                except grpc.RpcError:
                    pass
                time.sleep(0.2)
        raise AssertionError(f"gateway {self.address} not SERVING {list(services)} within {timeout:.0f}s:\n"
                             f"{self.tail()}")

    def get(self, path: str) -> tuple[int, str]:
        import httpx
        response = httpx.get(f"http://127.0.0.1:{self.http_port}{path}", timeout=5.0, trust_env=False)
        return response.status_code, response.text

    def metric(self, name: str, **labels: str) -> float:
        """The sum of `name`'s samples with these labels, from /metrics (0 when absent)."""
        total = 0.0
        for line in self.get("/metrics")[1].splitlines():
            match = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
            if match:
                found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
                if all(found.get(k) == v for k, v in labels.items()):
                    total += float(match.group(2))
        return total

    def kill(self) -> None:
        kill(self.process)

    def stop(self) -> None:
        terminate(self.process)

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""
