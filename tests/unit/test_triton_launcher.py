"""serving/tritonserver/launcher.py without starting a server: install lookup, backend dir, argv, env."""
from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from serving.tritonserver import launcher as tl
from routerkt.errors import UserError

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def install() -> tl.TritonInstall:
    try:
        return tl.find_install()
    except UserError as exc:
        pytest.skip(str(exc))


def test_free_port_is_bindable_on_loopback() -> None:
    port = tl.free_port()
    with socket.socket() as sock:
        sock.bind((tl.HOST, port))
    assert 0 < port < 65536


def test_install_is_found_in_this_interpreters_environment(install: tl.TritonInstall) -> None:
    assert Path(sys.prefix).resolve() in install.server.resolve().parents
    assert install.stub.parent.name == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert os.access(install.server, os.X_OK)


def test_backend_dir_holds_library_utils_and_stub(install: tl.TritonInstall) -> None:
    root = tl.backend_dir(install)
    python_dir = root / "python"
    assert {"libtriton_python.so", "triton_python_backend_utils.py", tl.STUB_NAME} <= {
        p.name for p in python_dir.iterdir()}
    assert os.access(python_dir / tl.STUB_NAME, os.X_OK)
    assert tl.backend_dir(install) == root                   # built once, then reused


def test_command_listens_on_loopback_with_the_documented_flags(install: tl.TritonInstall, tmp_path: Path) -> None:
    server = tl.TritonServer(tmp_path, ports=tl.TritonPorts(http=1001, grpc=1002, metrics=1003),
                             extra_args=["--log-verbose=1"], exit_timeout_s=7)
    argv = server.command(install, tmp_path / "backends")
    for flag in ("--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
                 "--http-port=1001", "--grpc-port=1002", "--metrics-port=1003", "--allow-gpu-metrics=false",
                 "--pinned-memory-pool-byte-size=0", "--exit-timeout-secs=7", "--model-control-mode=explicit",
                 "--load-model=*", "--disable-auto-complete-config", f"--model-repository={tmp_path.resolve()}"):
        assert flag in argv
    assert argv[argv.index("--metrics-config") + 1] == "summary_latencies=true"
    assert argv[-1] == "--log-verbose=1"
    assert (server.grpc_url, server.http_url, server.metrics_url) == ("127.0.0.1:1002", "127.0.0.1:1001",
                                                                      "127.0.0.1:1003")
    poll = tl.TritonServer(tmp_path, model_control="poll").command(install, tmp_path)
    assert "--model-control-mode=poll" in poll and "--load-model=*" not in poll


def test_environment_puts_the_venv_and_libraries_first(install: tl.TritonInstall) -> None:
    env = tl.server_env(install)
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent) or \
        Path(env["PATH"].split(os.pathsep)[0]).resolve() == Path(sys.executable).parent.resolve()
    libs = env["LD_LIBRARY_PATH"].split(os.pathsep)
    assert libs[0] == str(install.libs)
    import sysconfig
    assert sysconfig.get_config_var("LIBDIR") in libs


def test_bad_model_control_and_unstarted_server(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="model_control"):
        tl.TritonServer(tmp_path, model_control="sometimes")
    server = tl.TritonServer(tmp_path)
    assert not server.is_running() and server.pid is None and server.stub_pids() == []
    assert server.stop() == 0
    with pytest.raises(UserError, match="not a folder"):
        tl.TritonServer(tmp_path / "missing").start(timeout=1)


def test_access_puts_grpc_on_a_private_socket_turns_http_off_and_restricts_admin_apis(
        install: tl.TritonInstall, tmp_path: Path) -> None:
    from serving.security.triton_access import RESTRICTED_GROUPS, TritonAccess
    access = TritonAccess("routerkt-triton-key", "k3y")
    server = tl.TritonServer(tmp_path, ports=tl.TritonPorts(http=1001, grpc=1002, metrics=1003), access=access)
    argv = server.command(install, tmp_path / "backends")
    assert "--allow-http=false" in argv and not [a for a in argv if a.startswith(("--http-port", "--http-address"))]
    assert [a for a in argv if a.startswith("--grpc-address=")][0].startswith("--grpc-address=unix:/")
    assert f"--grpc-restricted-protocol={RESTRICTED_GROUPS}:routerkt-triton-key=k3y" in argv
    assert "--metrics-address=127.0.0.1" in argv and server.http_url is None
    assert "k3y" not in repr(access)
    tcp = tl.TritonServer(tmp_path, ports=tl.TritonPorts(http=1001, grpc=1002, metrics=1003),
                          access=TritonAccess("h", "k", unix_socket=False)).command(install, tmp_path)
    assert "--http-address=127.0.0.1" in tcp and "--grpc-address=127.0.0.1" in tcp
    assert f"--http-restricted-api={RESTRICTED_GROUPS}:h=k" in tcp and f"--grpc-restricted-protocol={RESTRICTED_GROUPS}:h=k" in tcp


def test_serve_key_is_new_per_run_private_or_the_given_file(tmp_path: Path) -> None:
    import stat
    from serving.security.triton_access import (GRPC_HEADER_PREFIX, TRITON_KEY_HEADER, grpc_headers,
                                                read_triton_key, serve_key_file)
    first = serve_key_file(None, tmp_path / "state")
    key = first.read_text().strip()
    assert stat.S_IMODE(first.stat().st_mode) == 0o600 and len(key) == 64
    assert serve_key_file(None, tmp_path / "state").read_text().strip() != key      # a new key per run
    given = tmp_path / "given.key"
    given.write_text("x-admin=s3cret\n")
    assert serve_key_file(given, tmp_path / "state") == given
    assert read_triton_key(given) == ("x-admin", "s3cret")
    # Triton's gRPC server wants the header as triton-grpc-protocol-<name> (2.51, checked in tests/e2e)
    assert grpc_headers(first) == {GRPC_HEADER_PREFIX + TRITON_KEY_HEADER: serve_key_file(first, tmp_path).read_text().strip()}
    for bad in ("", "a b", "h=k:x", "h=k,y"):
        given.write_text(bad)
        with pytest.raises(UserError, match="--triton-key-file"):
            serve_key_file(given, tmp_path / "state")
