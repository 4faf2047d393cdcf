"""Shared by the security tests: certificates made with the `openssl` command inside the test, a
fake inference backend (Triton is not the point there; its lifecycle is tests/fake_backend.py's), and
API keys issued into a file."""
from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from serving.security.api_keys import issue_key
from serving.security.scopes import SCOPES
from tests.fake_backend import IdleBackend


@dataclass(frozen=True)
class Pem:
    cert: Path
    key: Path


def _openssl(*args: str) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(folder: Path, name: str) -> Pem:
    folder.mkdir(parents=True, exist_ok=True)
    ca = Pem(folder / f"{name}.pem", folder / f"{name}.key")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(ca.key), "-out", str(ca.cert), "-days", "2", "-subj", f"/CN={name}")
    return ca


def make_cert(folder: Path, ca: Pem, name: str, client: bool = False) -> Pem:
    """A certificate for 127.0.0.1 / localhost (server) or a client certificate, signed by `ca`."""
    out = Pem(folder / f"{name}.pem", folder / f"{name}.key")
    csr, ext = folder / f"{name}.csr", folder / f"{name}.ext"
    ext.write_text("extendedKeyUsage=clientAuth\n" if client else
                   "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(out.key),
             "-out", str(csr), "-subj", f"/CN={name}")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key), "-set_serial",
             str(abs(hash(name)) % 10**9 + 1), "-out", str(out.cert), "-days", "1", "-extfile", str(ext))
    return out


def served_certificate(port: int) -> bytes:
    """The DER certificate a TLS server on 127.0.0.1:`port` presents now (a fresh connection)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2", "http/1.1"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, context.wrap_socket(raw) as sock:
        return sock.getpeercert(binary_form=True)


def der(pem: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.read_text())


def issue_all(path: Path) -> dict[str, str]:
    """One key per scope (key id = the scope's name) -> {scope: token}."""
    return {scope: issue_key(path, scope, [scope]) for scope in SCOPES}


def wrong_secret(token: str) -> str:
    """An authorization header with `token`'s key id and a secret one character off its own (the first)."""
    key_id, secret = token.split(".", 1)
    return f"Bearer {key_id}.{'y' if secret[0] == 'x' else 'x'}{secret[1:]}"


class FakeBackend(IdleBackend):
    """An InferenceBackend answering every version of the catalog: P = question id / 100."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []           # timeout_s of each inference

    @property
    def serving(self) -> bool:
        return True

    def ready_versions(self, model: str) -> frozenset[int]:
        versions = self.catalog.versions(model) if self.catalog is not None else {}
        return frozenset(versions)

    def ready_models(self) -> dict[str, list[int]]:
        return {"kt": [1]}

    def unavailable_reason(self, model: str) -> str | None:
        return None

    def describe(self) -> dict[str, object]:
        return {"backend": "fake"}

    async def infer(self, model, feeds, timeout_s: float) -> np.ndarray:
        self.timeouts.append(timeout_s)
        return feeds["questions"].astype(np.float32) / 100.0

    async def infer_outputs(self, model, feeds, outputs, timeout_s: float) -> dict[str, np.ndarray]:
        from serving.pipeline.parts import BackendError, FailureKind
        raise BackendError(FailureKind.REJECTED, "the fake backend serves no explain outputs")


def stderr_until(process, marker: str, seconds: float = 60.0) -> list[str]:
    """The lines `process` (stderr=PIPE, text) writes until one holds `marker`, it ends, or `seconds` pass."""
    import time
    seen: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        seen.append(line)
        if marker in line:
            break
    return seen
