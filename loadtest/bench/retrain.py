"""`routerkt bench retrain`: wall time and peak memory of `routerkt retrain`'s stages, per store size and kind.

The stages: the store export (`routerkt sessions export`), the training and the evaluation.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from loadtest.harness import ROUTERKT, add_common_flags, stop_children_on_sigterm
from routerkt.atomic import atomic_write_json
from routerkt.errors import UserError

SECRET = b"bench-retrain-secret-of-32-bytes!"
MEAN_EVENTS_PER_LEARNER = 155            # the synthetic generator's default lengths: uniform 10..300


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_flags(p, "retrain", model=False)
    p.add_argument("--events", default="100000,1000000", help="store sizes (events), comma-separated")
    p.add_argument("--stores", default="sqlite,redis", help="store kinds: sqlite, redis")
    p.add_argument("--retrain-up-to", type=int, default=200_000,
                   help="above this many events only the export is measured (training takes too long on few cores)")
    p.add_argument("--preset", default="routerkt-akt", help="preset of the served version (and so of the retrain)")
    p.add_argument("--epochs", type=int, default=None, help="retrain --epochs (default: retrain's)")


async def fill_store(url: str, frame, secret: bytes, t0_ms: int = 1_000_000, keep: int = 1000) -> int:
    """Append a canonical frame's learners as if Observed: event t of learner u at t0 + 1000 t + u % 1000 ms."""
    from serving.sessions.factory import open_store
    from serving.sessions.keys import LearnerKeys
    from serving.sessions.store import StoredEvent
    keys, store = LearnerKeys(secret), open_store(url)
    await store.open()
    stored, batch = 0, []
    try:
        for user, rows in frame.groupby("user_id", sort=False):
            key = keys.learner(f"learner-{user}")
            events = [StoredEvent(keys.event(key, str(order)), int(question),
                                  tuple(int(skill) for skill in str(skills).split(";")), int(correct),
                                  t0_ms + int(order) * 1000 + int(user) % 1000)
                      for order, question, skills, correct in zip(rows["order"], rows["question_id"],
                                                                  rows["skill_id"], rows["correct"])]
            batch.append((key, events))
            if len(batch) == 256:
                stored += sum(r.stored for r in await store.append_many(batch, keep, 1))
                batch = []
        if batch:
            stored += sum(r.stored for r in await store.append_many(batch, keep, 1))
    finally:
        await store.close()
    return stored


def _measured(command: list[str], log: Path) -> tuple[int, float, float]:
    """(exit code, wall seconds, peak RSS in MB) of one child process. The peak is VmHWM of /proc/PID/status,
    read every 20 ms (ru_maxrss would count the parent's pages the child shared before its exec)."""
    started, peak_kb = time.perf_counter(), 0
    with open(log, "w") as handle:
        child = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT)
        while child.poll() is None:
            try:
                status = Path(f"/proc/{child.pid}/status").read_text()
                peak_kb = max(peak_kb, int(status.split("VmHWM:")[1].split()[0]))
            except (OSError, IndexError, ValueError):
                pass
            time.sleep(0.02)
    return child.returncode, time.perf_counter() - started, peak_kb / 1024


def _served_version(out: Path, preset: str) -> Path:
    """A v1 of `preset` trained briefly on population A and exported (the version a retrain is gated against)."""
    from export.exporter import export_run
    from training.config import RunConfig
    from training.data.synthetic import generate, write_csv
    from training.models.registry import preset_config
    from training.training_run import run_training
    repo = out / "repository"
    if (repo / "kt").is_dir():
        return repo
    data = out / "population-a.csv"
    write_csv(generate(n_learners=150, seed=3), data)
    cfg = RunConfig(preset=preset, model=preset_config(preset))
    cfg.data.path, cfg.data.folds, cfg.train.epochs = str(data), 1, 1
    run_training(cfg, out / "runs" / "v1", progress=False)
    export_run(out / "runs" / "v1", repo, name="kt", log=lambda *_: None)
    return repo


def run(args: argparse.Namespace) -> int:
    from serving.sessions.redis_server import RedisServer
    from training.data.synthetic import generate
    sizes = [int(x) for x in args.events.split(",") if x.strip()]
    kinds = [k.strip() for k in args.stores.split(",") if k.strip()]
    if not sizes or any(n < 1000 for n in sizes) or not set(kinds) <= {"sqlite", "redis"}:
        raise UserError("--events: sizes >= 1000; --stores: sqlite and/or redis")
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    with ExitStack() as stack:
        stop_children_on_sigterm(stack)
        out = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="routerkt-bench-retrain-")))   # stores, runs
        repo = _served_version(out, args.preset) if any(n <= args.retrain_up_to for n in sizes) else None
        redis = stack.enter_context(RedisServer(out / "redis")) if "redis" in kinds else None
        for size in sizes:
            frame = generate(n_learners=max(10, size // MEAN_EVENTS_PER_LEARNER), seed=11, n_questions=240)
            for kind in kinds:
                url = f"sqlite:///{out / f'store-{size}.sqlite3'}" if kind == "sqlite" else redis.url
                if kind == "sqlite":
                    Path(url[len("sqlite:///"):]).unlink(missing_ok=True)
                else:
                    subprocess.run(["redis-cli", "-p", str(redis.port), "FLUSHALL"], capture_output=True)
                started = time.perf_counter()
                events = asyncio.run(fill_store(url, frame, SECRET))
                row = {"events": events, "store": kind, "fill_s": round(time.perf_counter() - started, 1)}
                code, wall, peak = _measured([*ROUTERKT, "sessions", "export", "--store", url, "--out",
                                              str(out / "events.csv")], args.out / f"export-{size}-{kind}.log")
                if code != 0:
                    raise UserError(f"sessions export failed (log {args.out / f'export-{size}-{kind}.log'})")
                row.update(export_s=round(wall, 1), export_peak_mb=round(peak),
                           export_events_per_s=round(events / wall))
                if repo is not None and size <= args.retrain_up_to:
                    folder = out / f"retrain-{size}-{kind}"
                    command = [*ROUTERKT, "retrain", "--store", url, "--repository", str(repo), "--model", "kt",
                               "--runs", str(out / "runs"), "--out", str(folder), "--policy-file",
                               str(out / "rollout.json"), "--margin", "1000"]
                    command += ["--epochs", str(args.epochs)] if args.epochs else []
                    code, wall, peak = _measured(command, args.out / f"retrain-{size}-{kind}.log")
                    if code not in (0, 3):
                        raise UserError(f"retrain failed (log {args.out / f'retrain-{size}-{kind}.log'})")
                    report = json.loads((folder / "report.json").read_text())
                    row.update(retrain_s=round(wall, 1), retrain_peak_mb=round(peak),
                               stages_s=report["seconds"], epochs_run=report["training"]["epochs_run"],
                               served_auc=round(report["served"]["auc"], 4),
                               new_auc=round(report["candidate"]["auc"], 4))
                results.append(row)
                print(json.dumps(row), flush=True)
                atomic_write_json(args.out / "retrain.json", {"preset": args.preset, "cpus": os.cpu_count(),
                                                              "results": results})
                (out / "events.csv").unlink(missing_ok=True)
    return 0
