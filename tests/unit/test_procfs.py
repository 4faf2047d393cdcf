"""serving/tritonserver/procfs.py against real processes: a child we start is found, named and seen to die."""
from __future__ import annotations

import mmap
import os
import subprocess
import sys
import time

import pytest

from serving.tritonserver.procfs import alive, children, cmdline, mapped_files, start_time, stat_fields, wait_gone

pytestmark = pytest.mark.unit


def test_a_child_is_found_named_and_waited_for():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)  # procfs-test"])
    try:
        assert child.pid in children(os.getpid())
        # Popen returns once exec has begun; the new command line shows a moment later on a busy host
        deadline = time.monotonic() + 10
        while "procfs-test" not in cmdline(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "procfs-test" in cmdline(child.pid)
        start = start_time(child.pid)
        child.kill()
        began = time.monotonic()
        wait_gone({child.pid: start}, timeout=60.0)
        # it returned because the unreaped child became a zombie, not because the bound ran out
        assert time.monotonic() - began < 30 and stat_fields(child.pid)[0] == "Z"
    finally:
        child.kill()
        child.wait()


def test_mapped_files_lists_what_a_process_maps_under_a_prefix(tmp_path):
    path = tmp_path / "region-1"
    path.write_bytes(b"\0" * 4096)
    with open(path, "r+b") as handle, mmap.mmap(handle.fileno(), 4096) as _:
        assert mapped_files([os.getpid()], str(tmp_path / "region-")) == {str(path)}
        assert mapped_files([os.getpid()], str(tmp_path / "other-")) == set()
    assert mapped_files([os.getpid()], str(tmp_path / "region-")) == set()


def test_a_process_is_alive_until_it_is_a_zombie_and_only_under_its_own_start_time() -> None:
    """Stubs are tracked by (PID, start time): a dying process that already dropped its command
    line still counts as alive, a zombie does not, and a PID reused by another process does not."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = start_time(proc.pid)
        assert start is not None and alive(proc.pid, start)
        assert not alive(proc.pid, str(int(start) + 1))          # same PID, another process
        proc.kill()
        deadline = time.monotonic() + 10
        while stat_fields(proc.pid)[0] != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)                                         # not reaped yet: a zombie
        assert not alive(proc.pid, start)
    finally:
        proc.kill()
        proc.wait()
    assert not alive(proc.pid, start) and start_time(proc.pid) is None
