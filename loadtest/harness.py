"""What every benchmark starts and declares: tritonserver, the gateway (in-process or as a
`routerkt serve` child process on loopback), and the shared flags (--repository, --model, --out).

    add_common_flags(p, "chaos")                       # --repository, --model, --out bench/chaos
    with ExitStack() as stack:
        stop_children_on_sigterm(stack)                # SIGTERM: the stack still stops what it started
        triton = start_triton(stack, repository, out)  # log OUT/triton.log, stopped by PID
        target = start_gateway(stack, repository, model, triton.grpc_url)    # in-process
        gateway = GatewayProcess(repository, folder, ["--triton-url", triton.grpc_url]).start()
        gateway.wait_serving(); gateway.metric("routerkt_triton_replica_inferences_total", replica="0")
        gateway.kill()  /  gateway.stop()  /  gateway.start()   # again, on the same ports

A GatewayProcess picks its ports once; each start appends to its own log (`gateway-<grpc port>-<start>.log`
in `folder`, or `log_name`). `env` adds variables (e.g. the session-key secret). The e2e tests use
it too.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from routerkt.errors import UserError
from serving.processes import free_port, kill, terminate

if TYPE_CHECKING:
    from serving.tritonserver.launcher import TritonServer

ROUTERKT = [sys.executable, "-m", "routerkt.cli"]
READY_TIMEOUT_S = 180.0          # Triton start + the model answering the gateway's probe


# -- flags ---------------------------------------------------------------------------------------
def add_common_flags(p: argparse.ArgumentParser, bench: str, model: bool = True) -> None:
    """--out (default bench/<bench>) and, with `model`, --repository and --model."""
    if model:
        p.add_argument("--repository", type=Path, default=Path("model_repository"), help="Triton model repository")
        p.add_argument("--model", default=None, help="model name (default: the repository's only model)")
    p.add_argument("--out", type=Path, default=Path(f"bench/{bench}"), help="output folder")


# -- signals -------------------------------------------------------------------------------------
def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def stop_children_on_sigterm(stack: ExitStack) -> None:
    """SIGTERM raises KeyboardInterrupt until `stack` closes (then the old handler is back), so the
    stack's callbacks stop what the benchmark started."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    stack.callback(signal.signal, signal.SIGTERM, previous)


# -- tritonserver --------------------------------------------------------------------------------
def start_tritons(stack: ExitStack, repository: Path, out: Path | None, names: Sequence[str]) -> list[TritonServer]:
    """One tritonserver per name over `repository` (log OUT/<name>.log; a temporary one without
    `out`), started side by side and stopped by PID when `stack` closes."""
    from serving.tritonserver.launcher import TritonServer

    tritons = [TritonServer(repository, log_path=out / f"{name}.log" if out else None, exit_timeout_s=5)
               for name in names]
    for triton in tritons:
        stack.callback(triton.stop)
    if len(tritons) == 1:
        print(f"starting tritonserver for {repository}" + (f" (log {tritons[0].log_path})" if out else ""),
              file=sys.stderr)
    else:
        print(f"starting {len(tritons)} tritonservers for {repository} (logs in {out})", file=sys.stderr)
    errors: list[BaseException] = []

    def start(triton: TritonServer) -> None:
        try:
            triton.start(timeout=READY_TIMEOUT_S)
        except (RuntimeError, UserError, OSError) as exc:     # re-raised below, in this thread
            errors.append(exc)
    starting = [threading.Thread(target=start, args=(t,)) for t in tritons]
    for thread in starting:
        thread.start()
    for thread in starting:
        thread.join()
    if errors:
        raise errors[0]
    return tritons


def start_triton(stack: ExitStack, repository: Path, out: Path | None, name: str = "triton") -> TritonServer:
    """One tritonserver (start_tritons)."""
    return start_tritons(stack, repository, out, [name])[0]


# -- the gateway in this process -----------------------------------------------------------------
def start_gateway(stack: ExitStack, repository: Path, model: str, triton_url: str, store_url: str | None = None,
                  track_outcomes: bool = True, **overrides) -> str:
    """An in-process gateway (stopped when `stack` closes), with a session store when `store_url`
    (and then outcome tracking, unless `track_outcomes` is False); `overrides`: other Settings
    fields. Returns its gRPC target once `model` is ready in Triton."""
    from serving.core.catalog import ModelCatalog
    from serving.metrics import Metrics
    from serving.server import ThreadedGateway
    from serving.sessions.factory import open_store
    from serving.sessions.keys import LearnerKeys
    from serving.settings import Settings

    settings = Settings(repository=repository, triton_url=triton_url, grpc_port=0, http_port=None,
                        grace_period_s=2.0, track_outcomes=track_outcomes, **overrides)
    metrics, catalog = Metrics(), ModelCatalog(repository)
    parts: dict = {"catalog": catalog}
    if store_url:
        parts.update(store=open_store(store_url), keys=LearnerKeys(os.urandom(32)))
    gateway = ThreadedGateway(settings, metrics, **parts).start()
    stack.callback(gateway.stop, 2.0)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not gateway.server.backend.ready_versions(model):
        if time.monotonic() > deadline:
            raise UserError(f"model {model!r} did not become ready in Triton within {READY_TIMEOUT_S:.0f} s")
        time.sleep(0.2)
    return f"127.0.0.1:{gateway.grpc_port}"


def start_servers(stack: ExitStack, repository: Path, model: str, out: Path) -> str:
    """Start Triton and an in-process gateway (stopped when `stack` closes); returns the gateway's target."""
    triton = start_triton(stack, repository, out)
    target = start_gateway(stack, repository, model, triton.grpc_url)
    print(f"gateway ready at {target} (Triton pid {triton.pid})", file=sys.stderr)
    return target


# -- the gateway as a child process --------------------------------------------------------------
class GatewayProcess:
    """`routerkt serve` on loopback ports, keyless (`--insecure`) unless `args` name `--api-keys`;
    `grace_period_s` None: serve's own default."""

    def __init__(self, repository: Path, folder: Path, args: Sequence[str] = (), env: dict[str, str] | None = None,
                 http: bool = True, grace_period_s: float | None = 2.0, log_name: str | None = None) -> None:
        self.repository, self.folder, self.args = Path(repository), Path(folder), list(args)
        self.env = {**os.environ, **(env or {})}
        self.grpc_port = free_port()
        self.http_port = free_port() if http else -1
        self.grace_period_s, self.log_name = grace_period_s, log_name
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self.folder.mkdir(parents=True, exist_ok=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def log(self) -> Path:
        return self.folder / (self.log_name or f"gateway-{self.grpc_port}-{self.starts}.log")

    def start(self) -> GatewayProcess:
        self.starts += 1
        grace = [] if self.grace_period_s is None else ["--grace-period", f"{self.grace_period_s:g}"]
        # the harness's own clients send no key: keyless (--insecure) unless the args give --api-keys
        keyless = [] if "--api-keys" in self.args else ["--insecure"]
        command = [*ROUTERKT, "serve", "--repository", str(self.repository), "--grpc-port", str(self.grpc_port),
                   "--http-port", str(self.http_port), "--state-dir", str(self.folder / "state"),
                   "--log-format", "json", *grace, *keyless, *self.args]
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


def gateway_over(repository: Path, triton_url: str, folder: Path) -> GatewayProcess:
    """`routerkt serve --triton-url URLS --store none` as a child process (stopped by PID)."""
    return GatewayProcess(repository, folder, ["--triton-url", triton_url, "--store", "none"])


def wait_replicas(gateway: GatewayProcess, replicas: int) -> None:
    """/readyz says ready and every one of `replicas` replicas serves (bounded)."""
    import httpx

    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if gateway.process is None or gateway.process.poll() is not None:
            raise UserError(f"the gateway exited (log {gateway.log})")
        try:
            status, text = gateway.get("/readyz")
            body = json.loads(text)
            served = [r["serving"] for r in body.get("replicas", [])] or [body.get("ready", False)]
            if status == 200 and len(served) == replicas and all(served):
                return
        except (OSError, ValueError, KeyError, TypeError, httpx.HTTPError):
            pass                                     # not listening yet
        time.sleep(0.3)
    raise UserError(f"the gateway over {replicas} Triton(s) was not ready within {READY_TIMEOUT_S:.0f} s "
                    f"(log {gateway.log})")
