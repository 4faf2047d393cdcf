"""The report of `routerkt bench loop`: the quality of what was served vs static v1, per day and in all.

loadtest/bench/loop.py turns each day's calls (loadtest/loop_replay.py's DayCalls) into a row; this
module scores them (AUC, log loss, Brier), names the canary's and the night's outcomes, renders the
table and writes OUT/loop.json and OUT/loop.md.
"""
from __future__ import annotations

import os
import platform
from collections import Counter
from pathlib import Path

import numpy as np

from loadtest.loop_replay import DayCalls
from routerkt.atomic import atomic_write_bytes, atomic_write_json

EPS = 1e-7                               # log loss clipping: retrain's and the gateway's
OUTCOMES = {"not_better": "not better", "canary_undecided": "canary undecided", "published": "published"}


def quality(correct: list[int], probs: list[float]) -> dict[str, float | int | None]:
    """AUC, log loss (p clipped to [EPS, 1 - EPS], as retrain's report and the gateway's outcome metrics) and
    Brier of the probabilities given for these answers."""
    from training.metrics import auc
    if not correct:
        return {"auc": None, "log_loss": None, "brier": None, "n": 0}
    y, p = np.asarray(correct, np.float64), np.asarray(probs, np.float64)
    clipped = np.clip(p, EPS, 1 - EPS)
    area = auc(y, p)
    return {"auc": None if np.isnan(area) else round(area, 4),
            "log_loss": round(float(-np.mean(y * np.log(clipped) + (1 - y) * np.log(1 - clipped))), 4),
            "brier": round(float(np.mean((p - y) ** 2)), 4), "n": int(y.size)}


def per_version(calls: DayCalls) -> dict[str, dict]:
    """Per version that answered: its answers' quality, and static v1's on the same answers (the same learners)."""
    out = {}
    for version in sorted(set(calls.version)):
        mine = [i for i, v in enumerate(calls.version) if v == version]
        correct = [calls.correct[i] for i in mine]
        out[f"v{version}"] = {"served": quality(correct, [calls.served[i] for i in mine]),
                              "static_v1": quality(correct, [calls.static[i] for i in mine])}
    return out


def shares(versions: list[int]) -> dict[str, float]:
    counts = Counter(versions)
    return {f"v{v}": round(n / len(versions), 3) for v, n in sorted(counts.items())} if versions else {}


def canary_text(test: dict | None, decided: dict[str, float]) -> str:
    if decided.get("guardrail"):
        return "rolled back (guardrail)"
    if not test:
        return "-"
    pair = f"v{test.get('candidate')} over v{test.get('baseline')}"
    outcomes = test.get("outcomes", {})
    counts = f"{outcomes.get('candidate', 0)}/{outcomes.get('baseline', 0)}"
    if decided.get("promote"):
        return f"{pair}: promoted ({counts})"
    if decided.get("rollback"):
        return f"{pair}: rolled back ({counts})"
    diff = test.get("difference", {})
    return f"{pair}: undecided ({counts}, [{diff.get('lower', 0):+.3f}, {diff.get('upper', 0):+.3f}])"


def retrain_text(code: int, report: dict) -> str:
    if code == 0:
        return f"published v{report.get('new_version')}"
    if code == 3:
        outcome = report.get("outcome")
        if outcome:
            return OUTCOMES.get(outcome, outcome)
        return "not better" if str(report.get("decision", "")).startswith("not better") else \
            str(report.get("decision", "nothing published"))[:60]
    return f"error (exit {code})"


def number(value: float | None, digits: int = 4) -> str:
    """`value` with `digits` decimals; "-" for None or NaN."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def _offline_text(night: dict) -> str:
    """" (v1 0.6457, new 0.6274)": the held-out log loss of every version the retrain compared, and the new
    model's."""
    compared = night.get("compared") or ({str(night.get("served_version")): night["served"]} if night.get("served")
                                         else {})
    if not compared or not night.get("candidate"):
        return ""
    parts = [f"v{v} {number(m.get('log_loss'))}" for v, m in sorted(compared.items(), key=lambda kv: int(kv[0]))]
    return f" ({', '.join(parts)}, new {number(night['candidate'].get('log_loss'))})"


def render(rows: list[dict], totals: dict) -> str:
    lines = ["| day | answers | served log loss | static v1 log loss | served AUC | static v1 AUC | answered by | "
             "canary during the day | night's retrain (held-out log loss) | retrain s | failed calls |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        versions = ", ".join(f"{v} {s:.0%}" for v, s in row["versions"].items()) or "-"
        night = row["retrain"]
        offline = _offline_text(night)
        lines.append(f"| {row['day']} | {row['answers']:,} | {number(row['served']['log_loss'])} | "
                     f"{number(row['static_v1']['log_loss'])} | {number(row['served']['auc'])} | "
                     f"{number(row['static_v1']['auc'])} | {versions} | {row['canary']} | "
                     f"{night['outcome']}{offline} | {night['seconds']:.0f} | {row['failed_calls']} |")
    lines.append(f"| all | {totals['answers']:,} | {number(totals['served']['log_loss'])} | "
                 f"{number(totals['static_v1']['log_loss'])} | {number(totals['served']['auc'])} | "
                 f"{number(totals['static_v1']['auc'])} | "
                 f"{', '.join(f'{v} {s:.0%}' for v, s in totals['versions'].items())} | "
                 f"{totals['promoted']} promoted, {totals['rolled_back']} rolled back | "
                 f"{totals['published']} published | {totals['retrain_seconds']:.0f} | {totals['failed_calls']} |")
    return "\n".join(lines) + "\n"


def machine() -> dict[str, object]:
    """The CPUs (model, AVX-512 and AVX2 flags) and the Python version of this run."""
    flags: set[str] = set()
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
            elif line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu": model, "avx512f": "avx512f" in flags, "avx2": "avx2" in flags,
            "python": platform.python_version()}


def write_report(out: Path, report: dict, rows: list[dict]) -> str:
    """The totals over `rows` into `report`, then OUT/loop.json and OUT/loop.md (the command and the
    table); the table. Each row holds its DayCalls under "_calls", left out of loop.json."""
    correct = [c for row in rows for c in row["_calls"].correct]
    served = [p for row in rows for p in row["_calls"].served]
    static = [p for row in rows for p in row["_calls"].static]
    versions = [v for row in rows for v in row["_calls"].version]
    report["totals"] = totals = {
        "answers": sum(row["answers"] for row in rows), "served": quality(correct, served),
        "static_v1": quality(correct, static), "versions": shares(versions),
        "promoted": int(sum(row["decisions"].get("promote", 0) for row in rows)),
        "rolled_back": int(sum(row["decisions"].get("rollback", 0) + row["decisions"].get("guardrail", 0)
                               for row in rows)),
        "published": sum(1 for row in rows if row["retrain"]["exit"] == 0),
        "retrain_seconds": round(sum(row["retrain"]["seconds"] for row in rows), 1),
        "failed_calls": sum(row["failed_calls"] for row in rows),
        "calls": sum(sum(row["calls"].values()) for row in rows)}
    table = render(rows, totals)
    atomic_write_json(out / "loop.json", {**report, "rows": [{k: v for k, v in row.items() if k != "_calls"}
                                                             for row in rows]})
    atomic_write_bytes(out / "loop.md", (f"`{report['command']}`\n\n" + table).encode())
    return table
