"""Start and stop the `tritonserver` binary bundled in the nvidia-pytriton wheel (Triton 2.51, CPU).

The wheel ships the server, the python backend library and one Python stub per interpreter
version, but running it standalone needs four things (docs/operations.md, "Triton 2.51 facts"), done
here and in serving/tritonserver/install.py (1-4):
1. a backend directory assembled by hand: python/{libtriton_python.so,
   triton_python_backend_utils.py, triton_python_backend_stub (for this interpreter's X.Y)};
   built once, atomically, under the venv (or the temp dir when the venv is read-only);
2. LD_LIBRARY_PATH with the wheel's `nvidia_pytriton.libs` (a copied stub loses its RPATH);
3. LD_LIBRARY_PATH with this interpreter's LIBDIR (else the stub loads another libpython);
4. PATH starting with the venv's bin (the stub's embedded Python finds its prefix via python3).
Everything is found relative to the CURRENT interpreter (sys.executable's venv). The repository is
byte-compiled before start (the stub writes __pycache__ otherwise, which reloads poll-mode models).
Servers listen on 127.0.0.1 only; only processes started here are signalled, by PID. Each server
gets a guard process (serving/tritonserver/watchdog.py) that stops it, its stubs and their shared memory
if the process that started it dies without doing so. Each server runs with a /dev/shm of its own where
the host allows it (serving/tritonserver/private_shm.py): other local users cannot read its tensors.

With a `TritonAccess` (what `routerkt serve` gives its Triton, docs/security.md), Triton's gRPC
listens on a Unix socket in a private folder (mode 0700: no other user of the host can connect),
its HTTP port is off, and model control, the repository, configs, statistics, shared memory,
trace and logging answer only calls carrying the key header (Triton's --grpc-restricted-protocol;
a gRPC client sends the header as `triton-grpc-protocol-<header>`). Only the metrics port stays on
loopback TCP (read-only numbers). The command line is built in serving/tritonserver/command.py, the
wait for readiness (HTTP, or gRPC on the socket) polls serving/tritonserver/triton_ready.py.
"""
from __future__ import annotations

import atexit
import compileall
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from routerkt.errors import UserError
from serving.processes import free_port
from serving.security.triton_access import RESTRICTED_GROUPS, TritonAccess
from serving.tritonserver.command import HOST, ModelControl, TritonCommand, TritonPorts, socket_path
from serving.tritonserver.install import STUB_NAME, TritonInstall, backend_dir, find_install, server_env
from serving.tritonserver.private_shm import private_shm_prefix, warn_shared
from serving.tritonserver.procfs import alive, children, cmdline, mapped_files, start_time, wait_gone
from serving.tritonserver.triton_ready import GrpcReadiness, HttpReadiness, ReadinessCheck

log = logging.getLogger("routerkt.serve")
SHM_PREFIX = "/dev/shm/triton_python_backend_shm_region"
_PORT_RETRIES = 3            # auto-chosen ports can be taken between choice and bind
_LIVE: set["TritonServer"] = set()   # started and not yet stopped: stopped at interpreter exit


class TritonServer:
    """One tritonserver process serving `repository` on 127.0.0.1."""

    def __init__(self, repository: Path | str, ports: TritonPorts | None = None,
                 model_control: str = "explicit", log_path: Path | None = None,
                 extra_args: Sequence[str] = (), exit_timeout_s: int = 10,
                 access: TritonAccess | None = None, private_shm: bool = True) -> None:
        self.repository = Path(repository).resolve()
        self.access = access                  # restricted APIs keyed by a header; gRPC on a private socket
        # a /dev/shm of its own (serving/tritonserver/private_shm.py) where the host allows it
        self.shm_prefix = private_shm_prefix() if private_shm else None
        if private_shm and self.shm_prefix is None:
            warn_shared()
        self._socket_dir: Path | None = None  # made on the first start, kept across restarts (close())
        self._auto_ports = ports is None
        self.ports = ports or TritonPorts(free_port(), free_port(), free_port())
        try:
            self.model_control = ModelControl(model_control)
        except ValueError:
            raise UserError(f"model_control must be one of {[m.value for m in ModelControl]}, "
                            f"got {model_control!r}") from None
        self._own_log = log_path is None     # None: a temp file, deleted when the server exits
        self.log_path = Path(log_path) if log_path else None
        self.extra_args = list(extra_args)
        self.exit_timeout_s = exit_timeout_s
        self._proc: subprocess.Popen | None = None
        self._shm_seen: set[str] = set()      # python-backend shm files our processes mapped
        self._stubs_seen: dict[int, str] = {}  # stub PID -> its start time (stubs outlive a dead server)
        self._watchdog: subprocess.Popen | None = None   # stops the server if this process dies first

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self, timeout: float = 90.0) -> None:
        """Spawn the server and wait (bounded) until /v2/health/ready answers 200."""
        if self.is_running():
            raise RuntimeError(f"tritonserver already running (pid {self.pid})")
        if not self.repository.is_dir():
            raise UserError(f"model repository {self.repository} is not a folder")
        install = find_install()
        backends = backend_dir(install)
        if self.access is not None and self.access.unix_socket and self._socket_dir is None:
            self._socket_dir = Path(tempfile.mkdtemp(prefix="routerkt-triton-"))   # mode 0700, short path
        compileall.compile_dir(str(self.repository), quiet=1)
        deadline = time.monotonic() + timeout
        for attempt in range(_PORT_RETRIES):
            self._spawn(install, backends)
            error = self._wait_ready(deadline)
            if error is None:
                self._snapshot_shm()
                return
            tail = self.log_tail()
            self.stop(timeout=10.0)
            if self._auto_ports and "already in use" in tail and attempt + 1 < _PORT_RETRIES:
                self.ports = TritonPorts(free_port(), free_port(), free_port())
                continue
            raise RuntimeError(f"tritonserver did not become ready: {error}\n--- log tail ---\n{tail}")

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, wait up to `timeout`, then SIGKILL; returns the exit code (0 if never started)."""
        proc = self._proc
        if proc is None:
            return 0
        if proc.poll() is None:
            self.stub_pids()                   # records the stubs and their shm regions
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10.0)
        self._after_exit()
        return proc.returncode

    def close(self, timeout: float = 20.0) -> int:
        """stop(), then remove the private socket folder (a later start() makes a new one); the exit code."""
        code = self.stop(timeout=timeout)
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None
        return code

    def kill(self) -> None:
        """SIGKILL the server (crash-recovery tests); orphaned stubs are killed too."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        self.stub_pids()                       # records the stubs and their shm regions
        proc.kill()
        proc.wait(timeout=10.0)
        self._after_exit()

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> "TritonServer":
        if not self.is_running():
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- addresses and processes -----------------------------------------------------------------
    @property
    def socket_path(self) -> Path | None:
        """The Unix socket Triton's gRPC listens on (Triton appends ":<port>" to the address it is
        given), or None on loopback TCP."""
        if self._socket_dir is None:
            return None
        return socket_path(self._socket_dir, self.ports.grpc)

    @property
    def http_enabled(self) -> bool:
        return self.access is None or not self.access.unix_socket

    @property
    def grpc_url(self) -> str:
        """The gRPC target: HOST:PORT, or unix:PATH for a socket (grpc's syntax; the path ends in :PORT)."""
        if self.socket_path is not None:
            return f"unix:{self.socket_path}"
        return f"{HOST}:{self.ports.grpc}"

    @property
    def http_url(self) -> str | None:
        return f"{HOST}:{self.ports.http}" if self.http_enabled else None

    @property
    def metrics_url(self) -> str:
        return f"{HOST}:{self.ports.metrics}"

    @property
    def private_shm(self) -> bool:
        """Whether the server runs with a /dev/shm of its own (no other user can read its tensors)."""
        return self.shm_prefix is not None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def stub_pids(self) -> list[int]:
        """PIDs of this server's triton_python_backend_stub children (read from /proc)."""
        if not self.is_running():
            return []
        pids = [pid for pid in children(self._proc.pid) if STUB_NAME in cmdline(pid)]
        self._snapshot_shm(pids)
        return pids

    def log_tail(self, lines: int = 60) -> str:
        """The last `lines` lines of the server log ('' when there is none)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            text = handle.read().decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    # -- internals -------------------------------------------------------------------------------
    def command(self, install: TritonInstall, backends: Path) -> list[str]:
        """The tritonserver argv (without starting anything; serving/tritonserver/command.py)."""
        return TritonCommand(self.repository, self.ports, self.model_control, self.exit_timeout_s, self.access,
                             self._socket_dir, self.extra_args).argv(install, backends)

    def _spawn(self, install: TritonInstall, backends: Path) -> None:
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="routerkt-triton-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # A new session: Ctrl-C in a terminal reaches our process, which stops Triton in order.
            argv = [*(self.shm_prefix or ()), *self.command(install, backends)]
            self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                          stdout=log, stderr=subprocess.STDOUT,
                                          env=server_env(install), start_new_session=True)
            self._watchdog = _start_watchdog(self._proc.pid, log, self._socket_dir)
        _LIVE.add(self)

    def _wait_ready(self, deadline: float) -> str | None:
        check: ReadinessCheck = HttpReadiness(self.http_url) if self.http_enabled else GrpcReadiness(self.grpc_url)
        try:
            while time.monotonic() < deadline:
                code = self._proc.poll()
                if code is not None:
                    return f"tritonserver exited with code {code}"
                self._snapshot_shm()               # best effort: a failing load may exit uncleanly
                if check.ready():
                    return None
                time.sleep(0.2)
        finally:
            check.close()
        return "timed out waiting for /v2/health/ready"

    def _snapshot_shm(self, stub_pids: Sequence[int] | None = None) -> None:
        """Remember the python-backend shared-memory files our server (and stubs) map."""
        if not self.is_running():
            return
        stubs = list(stub_pids) if stub_pids is not None else children(self._proc.pid)
        for pid in stubs:
            start = start_time(pid)
            if start is not None and STUB_NAME in cmdline(pid):
                self._stubs_seen[pid] = start
        self._shm_seen.update(shm_files([self._proc.pid, *stubs]))

    def _after_exit(self) -> None:
        """Wait (bounded) for our stubs to exit (SIGKILL the orphans that do not), then remove the
        shared-memory files that only our (now dead) server and its stubs mapped; the names hold a
        per-server UUID."""
        _LIVE.discard(self)
        if self._watchdog is not None:           # it exits within its poll interval once the server is gone
            try:
                self._watchdog.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                self._watchdog.kill()
                self._watchdog.wait()
            self._watchdog = None
        reap_stubs(dict(self._stubs_seen), set() if self.private_shm else self._shm_seen)
        self._stubs_seen.clear()
        self._shm_seen.clear()
        if self._own_log and self.log_path is not None:   # a temp log of ours: pass log_path to keep it
            self.log_path.unlink(missing_ok=True)
            self.log_path = None


def _start_watchdog(triton_pid: int, log, socket_dir: Path | None = None) -> subprocess.Popen | None:
    """serving/tritonserver/watchdog.py for the server `triton_pid` (None when /proc cannot name the
    processes); `socket_dir`: its private socket folder, removed with an orphaned server."""
    own, triton = start_time(os.getpid()), start_time(triton_pid)
    if own is None or triton is None:
        return None
    return subprocess.Popen([sys.executable, "-m", "serving.tritonserver.watchdog", str(os.getpid()), own,
                             str(triton_pid), triton, *([str(socket_dir)] if socket_dir else [])],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)


def reap_stubs(stubs: dict[int, str], shm: set[str]) -> None:
    """After a server is gone: wait (bounded) for its stubs (PID -> start time) to exit, SIGKILL the
    orphans that do not (a stub killed mid-request never exits on its own, Triton 2.51), then
    remove the shared-memory files `shm` that only they and the server mapped (per-server names)."""
    wait_gone(stubs, timeout=3.0)
    for pid, start in stubs.items():
        if alive(pid, start):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    wait_gone(stubs, timeout=10.0)
    for path in sorted(shm):
        try:
            os.unlink(path)
        except OSError:
            pass


def shm_files(pids: Sequence[int]) -> set[str]:
    """The python-backend shared-memory files that the processes `pids` map."""
    return mapped_files(pids, SHM_PREFIX)


@atexit.register
def _stop_leftovers() -> None:
    """Stop servers this process started and never stopped (e.g. a test that crashed)."""
    for server in list(_LIVE):
        try:
            server.close()
        except Exception:
            pass


def start_beside_gateway(repository: Path, gateway_ports: set[int | None], log_path: Path | None,
                         access: TritonAccess | None = None) -> "TritonServer":
    """Start tritonserver for `repository` on free loopback ports (never the gateway's), guarded by
    `access` (gRPC on a private Unix socket, restricted APIs), and wait until it is ready; a failure
    is one UserError line (the tail of Triton's log goes to stderr)."""
    taken = gateway_ports
    ports = []
    while len(ports) < 3:                                       # free ports, never the gateway's
        port = free_port()
        if port not in taken and port not in ports:
            ports.append(port)
    server = TritonServer(repository, ports=TritonPorts(*ports), log_path=log_path, access=access)
    log.info("Triton: starting tritonserver for %s", repository)
    try:
        server.start(timeout=180)
    except RuntimeError as exc:                                 # one line; the tail of Triton's log follows
        server.close()
        head, _, tail = str(exc).partition("\n")
        print(tail, file=sys.stderr)
        raise UserError(f"{head} (Triton's log: {server.log_path})") from None
    except BaseException:
        server.close()
        raise
    http = f"http://{server.http_url}" if server.http_url else "off"
    restricted = f", {RESTRICTED_GROUPS} need the key header" if access is not None else ""
    log.info("Triton: gRPC %s, HTTP %s, metrics http://%s/metrics (pid %s, log %s%s)",
             server.grpc_url, http, server.metrics_url, server.pid, server.log_path, restricted)
    return server
