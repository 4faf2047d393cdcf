"""The retrain's report: the table printed at the end, and report.json / report.txt in the run folder.

`report` is the loop/retrain/run.py Report the stages filled.
"""
from __future__ import annotations

from pathlib import Path

from routerkt.atomic import atomic_write_bytes, atomic_write_json


def write_report(report, out: Path) -> str:
    """report.json and report.txt in `out`; returns the table."""
    from dataclasses import asdict
    table = render(report)
    atomic_write_json(Path(out) / "report.json", asdict(report))
    atomic_write_bytes(Path(out) / "report.txt", table.encode())
    return table


def render(report) -> str:
    """The report as the table printed at the end (report.txt)."""
    sizes = report.sizes
    store = f" from the {report.store} store" if report.store else ""
    base = "" if report.base_version in (None, report.served_version) else f"; base version {report.base_version}"
    lines = [f"retrain of {report.model}{store}; served version {report.served_version}{base}"]
    if report.canary is not None:
        lines.append(f"canary: {report.canary['text']}")
    if sizes:
        vocab = report.vocab
        lines += [f"events {sizes.get('events', 0):,} of {sizes.get('learners', 0):,} learners; "
                  f"cutoff {report.cutoff}: train {sizes.get('train_events', 0):,} events "
                  f"({sizes.get('train_learners', 0):,} learners), held out {sizes.get('heldout_events', 0):,} "
                  f"({sizes.get('heldout_learners', 0):,} learners)",
                  f"vocabulary: {vocab.get('questions', 0)} questions ({vocab.get('new_questions', 0)} new), "
                  f"{vocab.get('skills', 0)} skills ({vocab.get('new_skills', 0)} new) against version "
                  f"{vocab.get('against_version', '?')}; "
                  f"warm start: {_warm_text(report.warm_start)}",
                  "", f"{'held-out events':<24}{'AUC':>8}{'log loss':>10}{'Brier':>8}"]
    rows = [(f"served v{v}" if int(v) == report.served_version else f"canary candidate v{v}", metrics)
            for v, metrics in report.compared.items()] + [("new", report.candidate)]
    for name, metrics in rows:
        if metrics:
            lines.append(f"{name:<24}{metrics['auc']:>8.4f}{metrics['log_loss']:>10.4f}{metrics['brier']:>8.4f}")
    lines += ["", "seconds: " + ", ".join(f"{k} {v}" for k, v in report.seconds.items()), report.decision]
    if report.config:
        lines.append(f"config.pbtxt: {report.config}")
    if report.policy:
        lines.append(f"policy: {report.policy}")
    return "\n".join(lines) + "\n"


def _warm_text(warm: dict | None) -> str:
    if not warm:
        return "off"
    if "note" in warm:
        return warm["note"]
    return (f"from version {warm.get('version', '?')}'s run {warm['from']} ({warm['copied']} tensors copied, "
            f"{warm['row_mapped']} question/skill tables row by row, {len(warm['fresh'])} fresh)")
