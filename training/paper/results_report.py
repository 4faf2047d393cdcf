"""RESULTS.md from a `routerkt reproduce` results directory: AUC / ACC / RMSE (mean +- std over the
folds that ran) per dataset x preset with the best per dataset in bold, the ablation and grid
tables, paired differences to each backbone's dense control, leak-audit verdicts where a run was
audited, the attention-diversity table, wall times and the published reference numbers.

The prose is in report_template.md and the published numbers in published_numbers.json, both next
to this file; this module only computes and lays out the tables.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from routerkt.atomic import atomic_write_bytes
from training.config import Batching, Protocol, RunConfig, from_dict, to_dict
from training.eval.history_score import cached_history_only
from training.paper.variants import BASELINE, GROUPS

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "report_template.md"
PUBLISHED = HERE / "published_numbers.json"


def _template() -> dict[str, str]:
    """The template's parts by name (see report_template.md)."""
    parts = re.split(r"^<!-- (\w+) -->\n", TEMPLATE.read_text(), flags=re.MULTILINE)
    return {name: body.rstrip("\n") for name, body in zip(parts[1::2], parts[2::2])}


def _published_table() -> list[str]:
    data = json.loads(PUBLISHED.read_text())
    lines = ["| " + " | ".join(data["columns"]) + " |", "|---" * len(data["columns"]) + "|"]
    for row in data["rows"]:
        auc = " / ".join(f"{a:.4f}" for a in row["auc"]) + (f" +- {row['std']:.4f}" if "std" in row else "")
        models = " / ".join(row["models"])
        lines.append(f"| {row['source']} | {row['protocol']} | {row['dataset']} | {models} | {auc} |")
    return lines


def _configs(out: Path) -> dict[Path, RunConfig]:
    """Each run folder's own config.json."""
    return {path.parent: from_dict(RunConfig, json.loads(path.read_text()))
            for path in sorted(out.glob("*/*/config.json"))}


def _load(out: Path, configs: dict[Path, RunConfig] | None = None) -> tuple[dict[str, dict[str, dict]], set[str]]:
    """{dataset: {run folder: metrics}} and the run folders whose routing leaks the future (by
    their config.json; `configs`: those already read by `_configs`)."""
    configs = _configs(out) if configs is None else configs
    runs: dict[str, dict[str, dict]] = {}
    leaky: set[str] = set()
    for path in sorted(out.glob("*/*/metrics.json")):
        dataset, variant = path.parent.parent.name, path.parent.name
        metrics = json.loads(path.read_text())
        if scored := cached_history_only(path.parent):     # stale caches (older scoring, other folds): left out
            metrics["history_only"] = scored
        runs.setdefault(dataset, {})[variant] = metrics
        if path.parent in configs:
            metrics["protocol"] = _protocol(configs[path.parent])
            if configs[path.parent].model.leaks_future:
                leaky.add(variant)
    return runs, leaky


def _protocol(cfg: RunConfig) -> str:
    """What a run and its paired control must share besides the model: the data protocol and the
    training settings (not the data file's spelling, the thread count or the device)."""
    data, train = to_dict(cfg.data), to_dict(cfg.train)
    for section, key in ((data, "path"), (train, "threads"), (train, "device")):
        section.pop(key, None)
    return json.dumps({"data": data, "train": train}, sort_keys=True)


def _by_protocol(runs: dict[str, dict[str, dict]]) -> tuple[dict, dict]:
    """The runs that cut histories the usual way (each learner's most recent window) and the others
    (`data.protocol=chunks`: other test positions, so never ranked beside the usual ones)."""
    usual: dict[str, dict[str, dict]] = {}
    other: dict[str, dict[str, dict]] = {}
    for d, r in runs.items():
        for v, m in r.items():
            protocol = json.loads(m.get("protocol", "{}")).get("data", {}).get("protocol", Protocol.RECENT.value)
            (usual if protocol == Protocol.RECENT.value else other).setdefault(d, {})[v] = m
    return usual, other


def _cell(m: dict, key: str) -> str:
    v = m.get(key, {})
    if not v or not math.isfinite(v.get("mean", math.nan)):
        return "-"
    return f"{v['mean']:.4f} +- {v['std']:.4f}"


def _table(runs: dict, variants: list[str], key: str, higher_better: bool, unranked: tuple = ()) -> list[str]:
    """One row per variant, one column per dataset; `unranked` rows are never marked best."""
    datasets = sorted(runs)
    lines = ["| preset | " + " | ".join(datasets) + " |", "|---|" + "---|" * len(datasets)]
    best = {}
    for d in datasets:
        scores = {v: runs[d][v][key]["mean"] for v in variants if v in runs[d] and v not in unranked}
        if scores:
            best[d] = (max if higher_better else min)(scores, key=scores.get)
    for v in variants:
        cells = []
        for d in datasets:
            m = runs[d].get(v)
            if m is None:
                cells.append("")
                continue
            text = _cell(m, key) + ("" if m.get("folds", 5) == 5 else f" ({m['folds']}f)")
            cells.append(f"**{text}**" if best.get(d) == v else text)
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    return lines


def _stalled_folds(out: Path) -> list[str]:
    rows = []
    for path in sorted(out.glob("*/*/fold-*/result.json")):
        r = json.loads(path.read_text())
        if r.get("best_epoch", 99) <= 2:
            fold_dir = path.parent
            rows.append(f"| {fold_dir.parent.parent.name} | {fold_dir.parent.name} | {r['fold']} | {r['best_epoch']} | "
                        f"{r['epochs_run']} | {r['valid_auc']:.4f} | {r['test']['auc']:.4f} |")
    return rows


def paired_difference(variant: list[float], control: list[float]) -> dict:
    """Per-fold variant - control differences (same folds, in fold order): mean, sample std (n-1),
    paired t statistic and its two-sided p-value (Student t, n-1 degrees of freedom)."""
    from scipy import stats

    n = min(len(variant), len(control))
    diffs = [a - b for a, b in zip(variant[:n], control[:n])]
    mean = sum(diffs) / n if n else math.nan
    if n < 2:
        return {"n": n, "mean": mean, "std": math.nan, "t": math.nan, "p": math.nan}
    std = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    if std == 0.0:
        return {"n": n, "mean": mean, "std": 0.0, "t": math.nan, "p": 1.0 if mean == 0.0 else 0.0}
    t = mean / (std / math.sqrt(n))
    return {"n": n, "mean": mean, "std": std, "t": t, "p": float(2 * stats.t.sf(abs(t), n - 1))}


def holm_adjusted(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment of p-values for testing them all at once (family-wise error):
    the i-th smallest of m is multiplied by m - i + 1, capped at 1 and made non-decreasing in that
    order. NaN p-values stay NaN and do not count in m."""
    order = sorted((p, k) for k, p in enumerate(p_values) if not math.isnan(p))
    adjusted, running = [math.nan] * len(p_values), 0.0
    for i, (p, k) in enumerate(order):
        running = max(running, min(1.0, (len(order) - i) * p))
        adjusted[k] = running
    return adjusted


def _stalled(metrics: dict) -> list[int]:
    """Folds whose best validation epoch is <= 2 (stopped before learning)."""
    return [k for k, epoch in enumerate(metrics.get("best_epochs", [])) if epoch <= 2]


def _paired_rows(runs: dict[str, dict[str, dict]], leaks: set[str]) -> list[str]:
    """One row per (dataset, run) with a run of its preset's dense control in the same dataset
    under the same protocol (data and training settings: a `chunks` run pairs with a `chunks`
    control, never with a `recent` one; the control's own folder name first). A run whose routing
    reads the future is compared by its history-only score (none cached: no row)."""
    from training.models.registry import dense_control

    rows = []                                                    # (cells before p, p, stalled flag)
    for d in sorted(runs):
        for v, m in sorted(runs[d].items()):
            preset = dense_control(m.get("preset", ""))
            same = [c for c in sorted(runs[d], key=lambda c: (c != preset, c))
                    if runs[d][c].get("preset") == preset and runs[d][c].get("protocol") == m.get("protocol")]
            scores = (m.get("history_only") or {}) if v in leaks else m
            if preset is None or not same or "folds" not in scores.get("auc", {}):
                continue
            control, c = same[0], runs[d][same[0]]
            v = v + ", history only" if v in leaks else v
            r = paired_difference(scores["auc"]["folds"], c["auc"]["folds"])
            stalled = sorted(set(_stalled(m)) | set(_stalled(c)))
            flag = ", ".join(str(k) for k in stalled) if stalled else "-"
            rows.append((f"| {d} | {v} | {control} | {r['n']} | {r['mean']:+.4f} | {r['std']:.4f} | "
                         f"{r['t']:.2f}", r["p"], flag))
    holm = holm_adjusted([p for _, p, _ in rows])
    return [f"{head} | {p:.3f} | {h:.3f} | {flag} |" for (head, p, flag), h in zip(rows, holm)]


def _audit_rows(out: Path) -> list[str]:
    """One row per run with an audit.json (`routerkt audit --run RUN`)."""
    rows = []
    for path in sorted(out.glob("*/*/audit.json")):
        a = json.loads(path.read_text())
        probe, visible, control = a.get("probe", {}), a.get("visible_answers", {}), a.get("control") or {}
        shown = f"{control['auc']:.4f}" if "auc" in control else "skipped"
        if "auc" in control and "tolerance" in control:
            shown += f" (+-{control['tolerance']:.3f})"
        rows.append(f"| {path.parent.parent.name} | {path.parent.name} | {a.get('fold', '-')} | "
                    f"{probe.get('max_diff', math.nan):.1e} | {visible.get('visible', '-')} / "
                    f"{visible.get('scored', '-')} | {shown} | {a.get('verdict', '-')} |")
    return rows


def _split(configs: list[RunConfig]) -> str:
    """How the runs chose their test learners, for the protocol line."""
    files = sorted({c.data.folds_file for c in configs if c.data.folds_file})
    kfold = any(not c.data.folds_file for c in configs)
    parts = (["5-fold cross-validation over learners with 10% of training learners for validation (seed 12405)"]
             if kfold else [])
    if files:
        parts.append("test learners of each fold from " + ", ".join(f"`{f}`" for f in files)
                     + " (the other learners train, 10% of them for validation)")
    return "; ".join(parts) or "no runs"


def render_report(out: Path) -> str:
    """The text of OUT/RESULTS.md from the runs in OUT."""
    out = Path(out)
    by_run = _configs(out)
    configs = list(by_run.values())
    runs, leaks = _load(out, by_run)
    text = _template()
    ablations = [v.folder for v in (BASELINE, *GROUPS["ablations"], *GROUPS["grid"])]
    main = [v.folder for v in GROUPS["all"]]              # every preset, then runs of other names
    main += sorted({v for r in runs.values() for v in r} - set(main) - set(ablations))
    lines = _preamble(text, out, configs)
    lines += _metric_tables(text, runs, main)
    lines += _ablation_tables(text, runs, ablations, leaks)
    for title, rows in (("paired", _paired_rows(runs, leaks)), ("audit", _audit_rows(out)),
                        ("stalled", _stalled_folds(out))):
        if rows:
            lines += [text[title]] + rows + [""]
    for diversity in sorted(out.glob("*/diversity/diversity.md")):
        lines += [text["diversity"].format(dataset=diversity.parent.parent.name, table=diversity.read_text().strip(),
                                           plots=diversity.parent.relative_to(out)), ""]
    lines += [text["wall_time"]] + _wall_time_rows(runs)
    lines += ["", text["published"], ""] + _published_table() + [""]
    return "\n".join(lines)


def _preamble(text: dict[str, str], out: Path, configs: list[RunConfig]) -> list[str]:
    """The introduction, the warning on biased batches when a run used them, the protocol and how to
    regenerate the results."""
    lines = [text["intro"], ""]
    if any(c.train.batching is Batching.LENGTH_BUCKETED for c in configs):
        lines += [text["biased"], ""]
    lines += [text["protocol"].format(split=_split(configs)), ""]
    commands = out / "REGENERATE.md"           # this folder's own commands, else those of results/
    lines += [commands.read_text().rstrip("\n") if commands.exists() else text["regenerate"], ""]
    return lines


def _metric_tables(text: dict[str, str], runs: dict[str, dict[str, dict]], main: list[str]) -> list[str]:
    """AUC, ACC and RMSE of the runs under the usual protocol, then the AUC of the others."""
    usual, other = _by_protocol(runs)
    lines: list[str] = []
    for key, title, higher in (("auc", "AUC", True), ("acc", "ACC", True), ("rmse", "RMSE", False)):
        shown = [v for v in main if any(v in r for r in usual.values())]
        lines += [f"## {title}", ""] + _table(usual, shown, key, higher) + [""]
    if other:
        lines += [text["other_protocols"], ""]
        lines += _table(other, [v for v in main if any(v in r for r in other.values())], "auc", True) + [""]
    return lines


def _ablation_tables(text: dict[str, str], runs: dict[str, dict[str, dict]], ablations: list[str],
                     leaks: set[str]) -> list[str]:
    """The ablation table (a leaking variant followed by its history-only row, never ranked) and, where
    the baseline ran more folds than a variant, the baseline's AUC over the same folds."""
    abl_runs = {d: dict(r) for d, r in runs.items() if any(v in r for v in ablations[1:])}
    if not abl_runs:
        return []
    leaky = [v for v in ablations if v in leaks]
    rows = list(ablations)
    for d, r in abl_runs.items():
        for v in leaky:
            if v in r and r[v].get("history_only"):
                r[v + ", history only"] = {**r[v]["history_only"], "folds": r[v]["folds"]}
    for v in leaky:
        rows.insert(rows.index(v) + 1, v + ", history only")
    lines = [text["ablations"], ""]
    lines += _table(abl_runs, [v for v in rows if any(v in r for r in abl_runs.values())], "auc", True,
                    unranked=tuple(leaky)) + [""]
    same_folds = []
    for d, r in sorted(abl_runs.items()):                 # same folds for a fair look at (Nf) cells
        base = r.get(ablations[0])
        for n in sorted({r[v].get("folds", 5) for v in ablations[1:] if v in r}):
            if base and base.get("folds", 5) > n:
                same = base["auc"]["folds"][:n]
                same_folds.append(text["same_folds"].format(dataset=d, n=n, baseline=ablations[0],
                                                            auc=sum(same) / len(same)))
    return lines + ((same_folds + [""]) if same_folds else [])


def _wall_time_rows(runs: dict[str, dict[str, dict]]) -> list[str]:
    rows = []
    for d in sorted(runs):
        for v, m in sorted(runs[d].items()):
            secs = ", ".join(f"{s:.0f}" for s in m.get("fold_seconds", []))
            rows.append(f"| {d} | {v} | {m.get('folds')} | {secs} | {m.get('train_seq_per_s', 0):.0f} |")
    return rows


def write_report(out: Path) -> Path:
    path = Path(out) / "RESULTS.md"
    atomic_write_bytes(path, render_report(out).encode())
    return path
