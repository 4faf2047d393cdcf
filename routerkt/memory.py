"""The memory policy of training commands: glibc's malloc without mmap, and an address-space cap.

glibc returning memory through mmap made CPU training ~1.8x slower here, so commands that train with
PyTorch run with `glibc.malloc.mmap_max=0`. The setting also keeps every freed block in the process
(inference benchmarks and servers, which hold several models at once, run without it) and can
fragment the heap far beyond the live data (a CL4KT step at batch 512: > 14 GB instead of 8), so
such a process also caps its address space: a runaway run fails with an allocation error instead
of the kernel's OOM killer shooting the largest process on the machine, maybe another job.
"""
from __future__ import annotations

import os
import sys

MALLOC_TUNABLE = "glibc.malloc.mmap_max=0"
TRAINING_COMMANDS = {"train", "evaluate", "audit", "reproduce", "bench train", "bench distributed"}
NO_REEXEC_ENV = "ROUTERKT_NO_REEXEC"


def has_malloc_setting(env=None) -> bool:
    return MALLOC_TUNABLE in (os.environ if env is None else env).get("GLIBC_TUNABLES", "")


def with_malloc_setting(env: dict[str, str]) -> dict[str, str]:
    """`env` (a copy) with the training malloc setting added to GLIBC_TUNABLES."""
    env = dict(env)
    if not has_malloc_setting(env):
        env["GLIBC_TUNABLES"] = ":".join(filter(None, [env.get("GLIBC_TUNABLES"), MALLOC_TUNABLE]))
    return env


def limit_memory() -> None:
    """Cap the address space at ROUTERKT_MAX_MEMORY_GB (default: the memory available at start, at
    least 4 GB; 0 = off)."""
    import resource
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) for line in f}
        default_gb = max(4.0, min(0.75 * info["MemTotal"], info["MemAvailable"]) / 2 ** 20)
    except (OSError, KeyError, ValueError, IndexError):
        return
    gb = float(os.environ.get("ROUTERKT_MAX_MEMORY_GB", default_gb))
    if gb > 0:
        limit = int(gb * 2 ** 30)
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard == resource.RLIM_INFINITY or hard > limit:
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def run_like_training(module: str, argv: list[str]) -> None:
    """In a process with the malloc setting: cap the memory and return. Otherwise re-execute
    `python -m module *argv` with it (never returns), unless NO_REEXEC_ENV is set."""
    if has_malloc_setting():
        limit_memory()
        return
    if os.environ.get(NO_REEXEC_ENV):
        return
    env = with_malloc_setting(os.environ)
    env[NO_REEXEC_ENV] = "1"
    os.execve(sys.executable, [sys.executable, "-m", module, *argv], env)
