"""What build this is: the package version and the git commit of the checkout (for provenance in
checkpoints and model versions, `routerkt --version` and the gateway's routerkt_build_info metric)."""
from __future__ import annotations

import subprocess
from pathlib import Path

from routerkt import __version__

HERE = Path(__file__).resolve().parent


def git_sha() -> str:
    """Short commit of the checkout this code runs from ("-dirty" with uncommitted tracked changes),
    or "unknown" outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                             cwd=HERE, timeout=5)
        sha = out.stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=HERE, timeout=5).stdout.strip()
        return (sha + ("-dirty" if dirty else "")) if sha else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def version() -> str:
    return __version__
