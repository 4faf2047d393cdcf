"""The gateway's TLS to Triton as settings and `routerkt serve` flags: the three files together
make a TritonTLS for every replica's client, a certificate needs its key, and the flags need
--triton-url (the Triton serve starts is on a private Unix socket). The TLS itself against a real
tritonserver: tests/e2e/test_triton_tls.py."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from routerkt.errors import UserError
from serving.cli import cli_serve
from serving.backends.triton.backend import tls_of
from serving.backends.triton.triton_client import TritonTLS, triton_tls
from serving.backends.triton.replica_set import TritonReplicaBackend, triton_backend
from serving.metrics import Metrics
from serving.settings import Settings

pytestmark = pytest.mark.unit


def serve_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="routerkt serve")
    cli_serve.add_arguments(parser)
    return parser.parse_args(argv)


def test_no_file_means_plaintext_and_any_file_means_tls() -> None:
    assert triton_tls(None, None, None) is None and tls_of(Settings().validate()) is None
    assert triton_tls(Path("ca.pem"), None, None) == TritonTLS(Path("ca.pem"))
    with pytest.raises(ValueError):
        TritonTLS(cert=Path("c.pem"))


def test_a_client_certificate_needs_its_key() -> None:
    with pytest.raises(UserError, match="--triton-tls-cert and --triton-tls-key"):
        Settings(triton_tls_cert=Path("c.pem")).validate()
    settings = Settings(triton_tls_ca="ca.pem", triton_tls_cert="c.pem", triton_tls_key="k.pem").validate()
    assert tls_of(settings) == TritonTLS(Path("ca.pem"), Path("c.pem"), Path("k.pem"))


def test_every_replica_client_gets_the_tls(tmp_path: Path) -> None:
    settings = Settings(triton_url="127.0.0.1:1,127.0.0.1:2", triton_tls_ca=tmp_path / "ca.pem").validate()
    backend = triton_backend(settings, Metrics())
    assert isinstance(backend, TritonReplicaBackend)
    assert [r.backend.client.tls for r in backend.replicas] == [TritonTLS(tmp_path / "ca.pem")] * 2


def test_serve_flags_need_triton_url_and_readable_files(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    base = ["--repository", str(tmp_path / "repo"), "--state-dir", str(tmp_path / "state"), "--store", "none"]
    ca = tmp_path / "ca.pem"
    ca.write_text("not used")
    with pytest.raises(UserError, match="need --triton-url"):
        cli_serve.run(serve_args([*base, "--triton-tls-ca", str(ca)]))
    with pytest.raises(UserError, match="cannot read"):
        cli_serve.run(serve_args([*base, "--triton-url", "127.0.0.1:1", "--triton-tls-ca", str(tmp_path / "no.pem")]))
    args = serve_args([*base, "--triton-url", "h:1", "--triton-tls-ca", str(ca), "--triton-tls-cert", "c", "--triton-tls-key", "k"])
    assert (args.triton_tls_ca, args.triton_tls_cert, args.triton_tls_key) == (ca, Path("c"), Path("k"))
