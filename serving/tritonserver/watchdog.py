"""A guard process for a tritonserver that `TritonServer` started: when the process that started it
dies without stopping it (SIGKILL, the OOM killer), the guard stops Triton, its python-backend
stubs and their shared memory, so nothing of ours outlives `routerkt serve`.

    python -m serving.tritonserver.watchdog OWNER_PID OWNER_START TRITON_PID TRITON_START [SOCKET_DIR]

SOCKET_DIR: the private folder of Triton's gRPC socket (TritonAccess), removed with it.

PIDs with their start times (/proc/<pid>/stat field 22) name processes exactly (a reused PID has
another start time). The guard runs in its own session (a Ctrl-C or a signal to the owner's
process group does not reach it), checks both processes every POLL_S, and exits as soon as
Triton is gone; `TritonServer` reaps it when it stops the server itself.
Why not a parent-death signal on Triton: Linux sends it when the *thread* that forked the child
exits, and the gateway restarts Triton from worker threads (serving/tritonserver/restarts.py).
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import time

from serving.tritonserver.procfs import alive, children, cmdline, start_time, wait_gone
from serving.tritonserver.launcher import STUB_NAME, reap_stubs, shm_files

POLL_S = 0.5
TERM_WAIT_S = 10.0      # Triton's own --exit-timeout-secs default in TritonServer


def stop_orphaned(triton: int, triton_start: str) -> None:
    """SIGTERM Triton (SIGKILL after TERM_WAIT_S), then its stubs that linger; remove their shm files."""
    stubs = {pid: start for pid in children(triton) if STUB_NAME in cmdline(pid)
             if (start := start_time(pid)) is not None}
    shm = shm_files([triton, *stubs])
    for sig, wait in ((signal.SIGTERM, TERM_WAIT_S), (signal.SIGKILL, 5.0)):
        if not alive(triton, triton_start):
            break
        try:
            os.kill(triton, sig)
        except ProcessLookupError:
            break
        wait_gone({triton: triton_start}, timeout=wait)
    reap_stubs(stubs, shm)


def main(argv: list[str]) -> int:
    owner, owner_start, triton, triton_start = int(argv[0]), argv[1], int(argv[2]), argv[3]
    socket_dir = argv[4] if len(argv) > 4 else None
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while alive(triton, triton_start):
        if not alive(owner, owner_start):
            print(f"routerkt: the process that started tritonserver (pid {owner}) is gone; stopping "
                  f"tritonserver (pid {triton}) and its stubs", file=sys.stderr, flush=True)
            stop_orphaned(triton, triton_start)
            if socket_dir is not None:
                shutil.rmtree(socket_dir, ignore_errors=True)
            return 0
        time.sleep(POLL_S)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
