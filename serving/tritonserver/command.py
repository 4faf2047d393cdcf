"""tritonserver's command line, as serving/tritonserver/launcher.py starts it: the ports, where it
listens (loopback TCP, or gRPC on a Unix socket in a private folder with HTTP off), the model-control
mode, and the APIs a `TritonAccess` key restricts (docs/security.md)."""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Sequence

from serving.security.triton_access import RESTRICTED_GROUPS, TritonAccess
from serving.tritonserver.install import TritonInstall

HOST = "127.0.0.1"
SOCKET_NAME = "triton.sock"          # in the private folder; Triton appends ":<grpc port>"


@dataclass
class TritonPorts:
    http: int
    grpc: int
    metrics: int


class ModelControl(str, Enum):
    EXPLICIT = "explicit"    # --model-control-mode=explicit --load-model=*  (load/unload API on)
    POLL = "poll"            # Triton rescans the repository every 2 s (load/unload API refused)
    NONE = "none"            # load everything once at start


def socket_path(socket_dir: Path, grpc_port: int) -> Path:
    """The Unix socket Triton's gRPC listens on, given `socket_dir`/SOCKET_NAME (Triton appends ":<port>")."""
    return socket_dir / f"{SOCKET_NAME}:{grpc_port}"


@dataclass(frozen=True)
class TritonCommand:
    """What the argv of one tritonserver is made of (`argv` builds it; nothing is started)."""

    repository: Path
    ports: TritonPorts
    model_control: ModelControl
    exit_timeout_s: int
    access: TritonAccess | None = None
    socket_dir: Path | None = None   # the private socket folder (None before the first start: a placeholder)
    extra_args: Sequence[str] = ()

    @property
    def on_unix_socket(self) -> bool:
        return self.access is not None and self.access.unix_socket

    def argv(self, install: TritonInstall, backends: Path) -> list[str]:
        args = [
            str(install.server),
            f"--model-repository={self.repository}",
            f"--backend-directory={backends}",
            f"--cache-directory={install.caches}",
            *self.listen_flags(), f"--metrics-address={HOST}",
            f"--metrics-port={self.ports.metrics}",
            "--allow-gpu-metrics=false", "--pinned-memory-pool-byte-size=0",
            "--metrics-config", "summary_latencies=true",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            # Our config.pbtxt files are complete. Auto-complete makes the python backend start an
            # extra stub per model load just to ask model.py for its config: loading a new version
            # took 1.7-2.6 s with it and 0.44-0.52 s without (2026-12-01, this 2-core host).
            "--disable-auto-complete-config",
        ]
        return args + self.model_control_flags() + self.restriction_flags() + list(self.extra_args)

    def listen_flags(self) -> list[str]:
        """gRPC on the private Unix socket with HTTP off, or both on loopback TCP."""
        if self.on_unix_socket:
            folder = self.socket_dir or Path(tempfile.gettempdir()) / "routerkt-triton-<private>"
            return [f"--grpc-address=unix:{folder / SOCKET_NAME}", f"--grpc-port={self.ports.grpc}",
                    "--allow-http=false"]
        return [f"--http-address={HOST}", f"--grpc-address={HOST}", f"--http-port={self.ports.http}",
                f"--grpc-port={self.ports.grpc}"]

    def model_control_flags(self) -> list[str]:
        if self.model_control is ModelControl.EXPLICIT:
            return ["--model-control-mode=explicit", "--load-model=*"]
        if self.model_control is ModelControl.POLL:
            return ["--model-control-mode=poll", "--repository-poll-secs=2"]
        return []

    def restriction_flags(self) -> list[str]:
        """The key header the restricted API groups need (none without an access key)."""
        if self.access is None:
            return []
        restriction = f"{RESTRICTED_GROUPS}:{self.access.header}={self.access.key}"
        flags = [f"--grpc-restricted-protocol={restriction}"]
        if not self.on_unix_socket:
            flags.append(f"--http-restricted-api={restriction}")
        return flags
