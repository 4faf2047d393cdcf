"""Start a training run: one process, one rank under torchrun, or N worker processes on this host
that each run `run.run_training` as one rank (training/distributed.py holds what a rank does).

Launch:
- `routerkt train ... --nproc N` (and `routerkt reproduce --nproc N`): `train()` starts N worker
  processes on this host (env MASTER_ADDR=127.0.0.1, a free MASTER_PORT, RANK, WORLD_SIZE,
  LOCAL_RANK), waits for them and fails the run with one line when one of them fails;
- `torchrun --nproc-per-node N -m routerkt.cli train ... --out DIR`: torchrun sets those variables,
  `distributed.from_env()` detects them and each process is one rank.

Failure: a worker that dies (signal, exception) makes the launcher stop the others (SIGTERM: they
exit through Python, so atomic writes remove their temporary files) and raise one UserError, e.g.
"training process 1 died (signal 9, SIGKILL)". A fold without result.json is never complete and is
trained again from scratch on resume (run.py).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from routerkt.memory import with_malloc_setting
from routerkt.errors import UserError
from training.config import RunConfig, from_dict, to_dict
from training.device import resolve as resolve_device
from training.distributed import RankInfo, from_env, peer_failure, process_group
from training.training_run import run_training

JOB_ENV = "ROUTERKT_DIST_JOB"          # launcher -> worker: the run (config, out, progress) as JSON
ERRORS_ENV = "ROUTERKT_DIST_ERRORS"    # launcher -> worker: folder for one-line UserError messages
PEER_LOST = 3                           # worker exit code: a collective failed because another process did
GRACE_S = 3.0                           # after a failure, how long the others get to exit on their own
TERM_WAIT_S = 10.0                      # SIGTERM -> SIGKILL


def train(cfg, out: Path, nproc: int = 1, progress: bool = True) -> dict | None:
    """Train `cfg` into `out` with `nproc` processes, or as one rank under torchrun. Returns the run's
    metrics (None on ranks other than 0 under torchrun)."""
    info = from_env()
    if nproc < 1:
        raise UserError("--nproc must be >= 1")
    if nproc > 1 and (info is None or not info.distributed):
        return launch(cfg, Path(out), nproc, progress)
    if info is not None and info.distributed:
        if nproc > 1:
            raise UserError("--nproc with torchrun: torchrun already started the processes; drop --nproc")
        try:
            with process_group(info, resolve_device(cfg.train.device, info.local_rank)):
                metrics = run_training(cfg, Path(out), progress=progress and info.is_main)
        except Exception as exc:
            if peer_failure(exc):
                raise UserError(f"training process {info.rank}: lost contact with another training process "
                                f"({str(exc).splitlines()[0][:160]})") from None
            raise
        return metrics if info.is_main else None
    return run_training(cfg, Path(out), progress=progress)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cfg, out: Path, nproc: int, progress: bool) -> dict:
    """Run `cfg` in `nproc` worker processes on this host; rank 0's metrics.json once all succeeded."""
    if cfg.train.threads <= 0:                      # share the cores instead of oversubscribing them
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, threads=max(1, cores // nproc)))
    errors = Path(tempfile.mkdtemp(prefix="routerkt-dist-"))
    base = dict(os.environ)
    base.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(nproc),
                 "LOCAL_WORLD_SIZE": str(nproc), ERRORS_ENV: str(errors),
                 JOB_ENV: json.dumps({"config": to_dict(cfg), "out": str(out), "progress": progress})})
    # workers run with the malloc setting of the training commands (routerkt/memory.py)
    base = with_malloc_setting(base)
    code = "import sys; from training.launch import _worker; sys.exit(_worker())"
    procs: list[subprocess.Popen] = []
    try:
        for rank in range(nproc):
            env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
            procs.append(subprocess.Popen([sys.executable, "-c", code], env=env))
        first, later = _wait(procs)
        if first:
            raise UserError(_describe(first, later, errors))
    finally:
        _stop(procs)
        shutil.rmtree(errors, ignore_errors=True)
    return json.loads((out / "metrics.json").read_text())


def _wait(procs: list[subprocess.Popen]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Wait for every worker; on the first failure, (rank, exit code) of those seen failing at the first
    failing poll, and of those that failed by themselves after them (a peer's loss makes others fail)."""
    while True:
        codes = [p.poll() for p in procs]
        if all(c == 0 for c in codes):
            return [], []
        first = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if first:
            deadline = time.monotonic() + GRACE_S          # the others notice the lost peer and exit
            while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                time.sleep(0.05)
            seen = {r for r, _ in first}
            later = [(r, p.returncode) for r, p in enumerate(procs)
                     if r not in seen and p.returncode not in (None, 0)]
            return first, later
        time.sleep(0.05)


def _cause_rank(code: int) -> int:
    """How likely an exit code is the run's cause rather than a consequence of another process's loss:
    0 a signal from outside (SIGKILL, ...), 1 an exit code of its own, 2 SIGABRT (a collective's thread
    terminated when its peer vanished) or PEER_LOST."""
    if code == -signal.SIGABRT or code == PEER_LOST:
        return 2
    return 0 if code < 0 else 1


def _describe(first: list[tuple[int, int]], later: list[tuple[int, int]], errors: Path) -> str:
    """One line naming the process that failed first (a UserError's own message when there is one);
    among those seen failing together, the likeliest cause (`_cause_rank`), then the lowest rank."""
    for rank, _ in sorted(first + later):
        message = errors / f"rank-{rank}.txt"
        if message.is_file():
            return message.read_text().strip()
    rank, code = min(first, key=lambda f: (_cause_rank(f[1]), f[0]))
    if code == PEER_LOST:
        return f"training process {rank} lost contact with the other training processes"
    if code < 0:
        try:
            name = f", {signal.Signals(-code).name}"
        except ValueError:
            name = ""
        return f"training process {rank} died (signal {-code}{name})"
    return f"training process {rank} failed (exit code {code}; its error is above)"


def _stop(procs: list[subprocess.Popen]) -> None:
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + TERM_WAIT_S
    for p in alive:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)     # unwinds through atomic_path, which removes its temporary file


def _worker() -> int:
    """A worker process of `launch`: one rank of the run described by env JOB_ENV."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    info = from_env() or RankInfo()
    job = json.loads(os.environ[JOB_ENV])
    try:
        cfg = from_dict(RunConfig, job["config"])
        with process_group(info, resolve_device(cfg.train.device, info.local_rank)):
            run_training(cfg, Path(job["out"]), progress=job["progress"] and info.is_main)
        return 0
    except UserError as exc:             # reported once, by the launcher
        (Path(os.environ[ERRORS_ENV]) / f"rank-{info.rank}.txt").write_text(str(exc))
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if peer_failure(exc):           # the launcher names the process that failed first
            return PEER_LOST
        raise
