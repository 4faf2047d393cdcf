"""locust as a bounded subprocess against a gateway, and reading the CSVs it writes (OUT/locust_*.csv;
the users: loadtest/locustfile.py). Used by `routerkt bench load` and its --sessions phases."""
from __future__ import annotations

import argparse
import csv
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from loadtest.learners import format_user_mix
from routerkt.errors import UserError

LOCUSTFILE = Path(__file__).resolve().with_name("locustfile.py")
LOCUST_FAILURES_EXIT = 3         # locust's exit code when requests failed (judged by the SLOs instead)
STARTUP_MARGIN_S = 45.0          # locust start-up + shutdown on a busy 2-core machine
STOP_WAIT_S = 15.0               # after SIGTERM, before SIGKILL
TOTAL = "Aggregated"             # locust's name of the all-requests row


@dataclass(frozen=True)
class RpcStats:
    """One row of locust's stats CSV (times in ms; None when there were no requests)."""

    requests: int
    failures: int
    requests_per_s: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    max_ms: float | None


def read_stats(path: Path) -> tuple[dict[str, RpcStats], RpcStats]:
    """Parse OUT/locust_stats.csv: ({rpc name: stats}, the all-requests row)."""
    rpcs: dict[str, RpcStats] = {}
    total: RpcStats | None = None
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                stats = RpcStats(requests=int(row["Request Count"]), failures=int(row["Failure Count"]),
                                 requests_per_s=float(row["Requests/s"]), p50_ms=_ms(row["50%"]),
                                 p95_ms=_ms(row["95%"]), p99_ms=_ms(row["99%"]), max_ms=_ms(row["Max Response Time"]))
                if row["Name"] == TOTAL and not row["Type"]:
                    total = stats
                else:
                    rpcs[row["Name"]] = stats
    except FileNotFoundError:
        raise UserError(f"{path}: locust wrote no stats (see its log)") from None
    except (KeyError, ValueError) as exc:
        raise UserError(f"{path}: unexpected locust CSV ({exc})") from None
    if total is None:
        raise UserError(f"{path}: no {TOTAL!r} row")
    return rpcs, total


def _ms(text: str) -> float | None:
    return None if text in ("", "N/A") else float(text)


def read_rows(path: Path) -> list[dict[str, str]]:
    """Rows of one of locust's other CSVs ([] when absent)."""
    if not path.is_file():
        return []
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def locust_command(args: argparse.Namespace, target: str, model: str, mix: dict[str, int], duration: int,
                   spawn_rate: float, out: Path) -> list[str]:
    return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
            "-u", str(args.users), "-r", f"{spawn_rate:g}", "-t", f"{duration}s", "--host", target,
            "--csv", str(out / "locust"), "--exit-code-on-error", str(LOCUST_FAILURES_EXIT),
            "--repository", str(args.repository.resolve()), "--model", model, "--weights", format_user_mix(mix),
            "--max-candidates", str(args.max_candidates), "--max-history", str(args.max_history),
            "--batch-learners", str(args.batch_learners), "--predict-timeout", f"{args.predict_timeout:g}",
            "--batch-timeout", f"{args.batch_timeout:g}", "--think-time", f"{args.think_time:g}", *mix]


def run_locust(command: list[str], out: Path, timeout_s: float) -> tuple[int | None, bool]:
    """Run locust (its own session, output in OUT/locust.log); (exit code, overran). Stopped by PID
    (SIGTERM, then SIGKILL) when it overruns or we are interrupted."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCUST_", "ROUTERKT_LOAD_"))}
    root = str(LOCUSTFILE.parents[1])                  # the checkout: `import loadtest` without an install
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    with open(out / "locust.log", "wb") as log:
        proc = subprocess.Popen(command, cwd=out, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=timeout_s), False
        except subprocess.TimeoutExpired:
            _stop(proc)
            return proc.returncode, True
        except BaseException:
            _stop(proc)
            raise


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)             # locust stops its users and writes its CSVs
        try:
            proc.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10.0)


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
