"""Find the nvidia-pytriton install of the current interpreter and assemble its python backend
directory and environment (launcher.py's steps 1-4)."""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from routerkt.errors import UserError

STUB_NAME = "triton_python_backend_stub"


@dataclass(frozen=True)
class TritonInstall:
    """Paths of the nvidia-pytriton install of the current interpreter."""

    server: Path             # pytriton/tritonserver/bin/tritonserver
    python_backend: Path     # pytriton/tritonserver/backends/python (library + utils, no stub)
    stub: Path               # pytriton/tritonserver/python_backend_stubs/<X.Y>/triton_python_backend_stub
    libs: Path               # site-packages/nvidia_pytriton.libs
    caches: Path             # pytriton/tritonserver/caches


def find_install() -> TritonInstall:
    """Locate tritonserver in the nvidia-pytriton package importable by this interpreter."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"nvidia-pytriton is not installed for {sys.executable} "
                        "(install the project with its 'serve' extra)")
    package = Path(list(spec.submodule_search_locations)[0])
    root = package / "tritonserver"
    pyver = f"{sys.version_info[0]}.{sys.version_info[1]}"
    install = TritonInstall(
        server=root / "bin" / "tritonserver",
        python_backend=root / "backends" / "python",
        stub=root / "python_backend_stubs" / pyver / STUB_NAME,
        libs=package.parent / "nvidia_pytriton.libs",
        caches=root / "caches",
    )
    for path in (install.server, install.python_backend / "libtriton_python.so",
                 install.python_backend / "triton_python_backend_utils.py", install.stub, install.libs):
        if not path.exists():
            raise UserError(f"incomplete nvidia-pytriton install: {path} is missing (Python {pyver})")
    return install


def backend_dir(install: TritonInstall) -> Path:
    """The assembled --backend-directory (built once; rebuilt if the wheel's files changed)."""
    sources = [install.python_backend / "libtriton_python.so",
               install.python_backend / "triton_python_backend_utils.py", install.stub]
    pyver = f"{sys.version_info[0]}.{sys.version_info[1]}"
    candidates = [Path(sys.prefix) / "triton-backends",
                  Path(tempfile.gettempdir()) / f"routerkt-triton-backends-{os.getuid()}-py{pyver}"]
    for root in candidates:
        python_dir = root / "python"
        if not all(_same_file(src, python_dir / src.name) for src in sources):
            try:
                _assemble(root, sources)
            except OSError:
                pass                   # read-only, or a concurrent builder won: checked just below
        if all(_same_file(src, python_dir / src.name) for src in sources):
            return root
    raise UserError("cannot assemble a Triton backend directory (venv and temp dir not writable)")


def _assemble(root: Path, sources: Sequence[Path]) -> None:
    """Copy `sources` into root/python atomically: staged beside it, then one rename."""
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    try:
        fresh = staging / "python"
        fresh.mkdir()
        for src in sources:
            shutil.copy2(src, fresh / src.name)          # keeps the stub's executable bit
        python_dir = root / "python"
        if python_dir.exists():        # a stale copy (the wheel changed): move it out of the way
            os.rename(python_dir, staging / "stale")
        os.rename(fresh, python_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def server_env(install: TritonInstall) -> dict[str, str]:
    """The environment tritonserver and its Python stubs need (see the module docstring)."""
    env = dict(os.environ)
    # the training commands' malloc setting (routerkt/memory.py) keeps freed memory in the process:
    # not for long-running servers holding large inference buffers
    tunables = [t for t in env.pop("GLIBC_TUNABLES", "").split(":") if t and t != "glibc.malloc.mmap_max=0"]
    if tunables:
        env["GLIBC_TUNABLES"] = ":".join(tunables)
    scripts = sysconfig.get_path("scripts") or str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in (scripts, env.get("PATH", "")) if p)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(install.libs), libdir, env.get("LD_LIBRARY_PATH", "")) if p)
    return env


def _same_file(src: Path, dst: Path) -> bool:
    try:
        return dst.stat().st_size == src.stat().st_size and os.access(dst, os.R_OK)
    except OSError:
        return False
