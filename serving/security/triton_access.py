"""The credential between the gateway and Triton (docs/security.md, "Triton and the session store").

Triton restricts groups of its API to calls carrying a header with a key (its
--grpc-restricted-protocol / --http-restricted-api GROUPS:HEADER=KEY). RESTRICTED_GROUPS are the
administrative ones: model control and the repository (a load request may upload a model.py that
then runs inside Triton), configs, statistics, shared memory, trace and logging. The key comes
from --triton-key-file (KEY, or HEADER=KEY) or, for the Triton that `routerkt serve` starts, is
made anew for each run and kept in <state dir>/triton.key (mode 0600), the file the gateway's
client then reads. Triton 2.51 expects the header of a gRPC call under the prefix
GRPC_HEADER_PREFIX (HTTP: as named). The key is never logged.
"""
from __future__ import annotations

import os
import re
import secrets
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from routerkt.errors import UserError

RESTRICTED_GROUPS = "model-repository,model-config,shared-memory,statistics,trace,logging"
TRITON_KEY_HEADER = "routerkt-triton-key"          # the header the deployments' restricted flags name
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"       # what Triton's gRPC server prepends to that name
KEY_FILE_NAME = "triton.key"
_HEADER = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_KEY = re.compile(r"[A-Za-z0-9._~+/-]{1,256}")     # nothing Triton's GROUPS:HEADER=KEY syntax splits on


@dataclass(frozen=True)
class TritonAccess:
    """How a started Triton is guarded: the restricted groups answer only `header: key`;
    `unix_socket`: gRPC on a Unix socket in a private folder and HTTP off (else loopback TCP, both
    protocols restricted)."""

    header: str
    key: str = field(repr=False)
    unix_socket: bool = True


def read_triton_key(path: Path | str) -> tuple[str, str]:
    """(header, key) from a file holding one line KEY (header TRITON_KEY_HEADER) or HEADER=KEY."""
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"--triton-key-file {path}: cannot read it ({type(exc).__name__})") from None
    header, _, key = text.partition("=") if "=" in text else (TRITON_KEY_HEADER, "=", text)
    header = header.strip().lower()
    if not _HEADER.fullmatch(header) or not _KEY.fullmatch(key):
        raise UserError(f"--triton-key-file {path}: expected one line KEY or HEADER=KEY "
                        "(header [a-z0-9-], key [A-Za-z0-9._~+/-], at most 256 characters)")
    return header, key


def grpc_headers(path: Path | str | None) -> dict[str, str] | None:
    """The gRPC metadata proving the key of `path` to Triton, or None without a file."""
    if path is None:
        return None
    header, key = read_triton_key(path)
    return {GRPC_HEADER_PREFIX + header: key}


def serve_key_file(key_file: Path | None, state_dir: Path) -> Path:
    """The key file of `routerkt serve`'s Triton: `key_file` when given (checked), else a new random
    key written to <state_dir>/triton.key with mode 0600 (replaced at every run)."""
    if key_file is not None:
        read_triton_key(key_file)
        return Path(key_file)
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / KEY_FILE_NAME
    fd, name = tempfile.mkstemp(prefix=f".{KEY_FILE_NAME}.", dir=state_dir)   # mode 0600 from the start
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(secrets.token_hex(32) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(name, path)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return path


def access_for(key_file: Path) -> TritonAccess:
    """The TritonAccess of a started Triton keyed by `key_file`."""
    header, key = read_triton_key(key_file)
    return TritonAccess(header, key)
