"""Triton's shared memory out of other users' reach: a /dev/shm of its own, in a new mount namespace.

Triton 2.51's python backend passes every request's tensors (the learner's answers, the
probabilities) through files /dev/shm/triton_python_backend_shm_region_<uuid>, created mode 0644
whatever the umask, with the name on the stubs' command lines: any local user could read them. So
the launcher starts tritonserver through `unshare`: a new mount namespace (and, for a user other
than root, a new user namespace mapping that user to root inside it) in which a fresh tmpfs of mode
0700 is mounted on /dev/shm before tritonserver is exec'd (same PID). The server and its stubs see
only that tmpfs; the host's /dev/shm holds nothing of theirs, another user cannot even list it
(/proc/<pid>/root is closed to other users), and it is freed when the last of them exits.

Where the host allows neither (no unshare, namespaces disabled, a container without
CAP_SYS_ADMIN), `private_shm_prefix()` is None and the caller says so in one warning line
(docs/security.md: inside a container the pod's own /dev/shm is private to the pod already).
"""
from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess

log = logging.getLogger("routerkt.serve")
PROBE_TIMEOUT_S = 10.0
# mount the private tmpfs, then become the command given after the script's $0
_SCRIPT = 'mount -t tmpfs -o mode=0700,nosuid,nodev routerkt-shm /dev/shm && exec "$@"'


@functools.lru_cache(maxsize=1)
def private_shm_prefix() -> tuple[str, ...] | None:
    """The argv prefix that runs a command with a private /dev/shm, or None where this host allows
    none (probed once per process by running `true` under it)."""
    unshare, mount, sh = shutil.which("unshare"), shutil.which("mount"), shutil.which("sh")
    if not (unshare and mount and sh):
        return None
    user = () if os.geteuid() == 0 else ("--user", "--map-root-user")
    prefix = (unshare, *user, "--mount", "--propagation", "private", "--", sh, "-c", _SCRIPT, "routerkt-triton")
    try:
        probe = subprocess.run([*prefix, shutil.which("true") or "/bin/true"], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return prefix if probe.returncode == 0 else None


def warn_shared() -> None:
    """The one start-up line for a host where Triton's shared memory stays readable by other users."""
    log.warning("Triton's python backend shares tensors through /dev/shm files other local users can "
                "read: this host allows no private mount namespace (unshare); run the gateway on a host "
                "or in a container of its own (docs/security.md)")
