"""Tests of training/paper/results_report.py: the prose comes from report_template.md and the published numbers
from published_numbers.json, the committed results/RESULTS.md and results/neutral/RESULTS.md are
exactly what the report renders from the committed runs, and the headline numbers of docs/training.md
are results/neutral/RESULTS.md's."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from training.paper import results_report as report

pytestmark = pytest.mark.unit

RESULTS = Path(__file__).resolve().parents[2] / "results"


def test_template_parts_and_published_numbers_are_there():
    parts = report._template()
    assert {"intro", "ablations", "same_folds", "stalled", "diversity", "wall_time", "published"} <= set(parts)
    rows = json.loads(report.PUBLISHED.read_text())["rows"]
    table = report._published_table()
    assert len(table) == 2 + len(rows)
    assert "| pyKT leaderboard | 200-chunks, 20% test | ASSIST2009 | AKT / simpleKT / DKT | 0.7853 / 0.7744 / 0.7541 |" in table


@pytest.mark.parametrize("folder", [RESULTS, RESULTS / "neutral"], ids=["results", "results/neutral"])
def test_committed_results_md_is_what_the_report_renders(folder):
    if not (folder / "RESULTS.md").is_file():
        pytest.skip(f"no {folder.name}/RESULTS.md")
    assert report.render_report(folder) == (folder / "RESULTS.md").read_text()


def _auc_table(text: str, after: str) -> list[str]:
    """The first markdown table after the line `after` (header row onwards)."""
    lines = text.splitlines()
    start = next(i for i in range(lines.index(after), len(lines)) if lines[i].startswith("| preset |"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def test_training_doc_headline_numbers_are_the_reports():
    """docs/training.md's headline table (dataset, best preset, its AUC, routerkt-akt, akt-standard)
    quotes results/neutral/RESULTS.md's AUC table; a stale or wrong cell fails here, and so does a
    "best preset" that is not the one RESULTS.md marks best (bold) for that dataset."""
    neutral = RESULTS / "neutral" / "RESULTS.md"
    if not neutral.is_file():
        pytest.skip("no results/neutral/RESULTS.md")
    table = _auc_table(neutral.read_text(), "## AUC")
    datasets = _cells(table[0])[1:]
    auc = {(cells[0], dataset): cell for cells in map(_cells, table[2:]) for dataset, cell in zip(datasets, cells[1:])}
    doc = (RESULTS.parent / "docs" / "training.md").read_text().splitlines()
    start = next(i for i, line in enumerate(doc) if line.startswith("| dataset | best preset |"))
    end = next((i for i in range(start, len(doc)) if not doc[i].startswith("|")), len(doc))
    rows = [_cells(line) for line in doc[start + 2:end]]
    assert {r[0] for r in rows} == set(datasets)
    for dataset, best, best_auc, router, standard in rows:
        assert auc[best, dataset] == f"**{best_auc}**", (dataset, best)
        assert auc["routerkt-akt", dataset].strip("*") == router, dataset
        assert auc["akt-standard", dataset].strip("*") == standard, dataset


def test_leaking_runs_are_known_from_their_config(tmp_path):
    from training.config import RunConfig, to_dict
    for name, scope in (("plain", "prefix"), ("renamed", "sequence")):
        cfg = to_dict(RunConfig())
        cfg["model"].update(heads="router", routing_scope=scope)
        (tmp_path / "toy" / name).mkdir(parents=True)
        (tmp_path / "toy" / name / "config.json").write_text(json.dumps(cfg))
        (tmp_path / "toy" / name / "metrics.json").write_text(json.dumps({"folds": 5}))
    _, leaky = report._load(tmp_path)
    assert leaky == {"renamed"}


def test_paired_difference_matches_a_paired_t_test():
    from scipy import stats
    variant, control = [0.75, 0.76, 0.74, 0.77, 0.75], [0.74, 0.74, 0.74, 0.75, 0.73]
    r = report.paired_difference(variant, control)
    expected = stats.ttest_rel(variant, control)
    assert r["n"] == 5 and abs(r["mean"] - 0.014) < 1e-12
    assert abs(r["t"] - expected.statistic) < 1e-9 and abs(r["p"] - expected.pvalue) < 1e-9
    diffs = [a - b for a, b in zip(variant, control)]
    assert abs(r["std"] - stats.tstd(diffs)) < 1e-12          # sample std (n - 1)
    assert report.paired_difference([0.7], [0.6])["n"] == 1


def test_holm_adjustment_steps_down_caps_at_one_and_keeps_nan():
    adjusted = report.holm_adjusted([0.04, 0.01, math.nan, 0.03, 0.5])
    # m = 4: 0.01 * 4 = 0.04, 0.03 * 3 = 0.09, 0.04 * 2 = 0.08 -> 0.09 (non-decreasing), 0.5 * 1
    assert [round(a, 12) for a in adjusted[:2]] == [0.09, 0.04] and math.isnan(adjusted[2])
    assert [round(a, 12) for a in adjusted[3:]] == [0.09, 0.5]
    assert report.holm_adjusted([0.6, 0.7]) == [1.0, 1.0]


def test_paired_rows_use_history_only_scores_of_leaking_runs_and_flag_stalled_folds():
    control = {"preset": "akt-standard", "auc": {"folds": [0.70, 0.71, 0.72]}, "best_epochs": [5, 1, 9]}
    leaky = {"preset": "routerkt-akt", "auc": {"folds": [0.80, 0.81, 0.82]}, "best_epochs": [4, 4, 4],
             "history_only": {"auc": {"folds": [0.69, 0.70, 0.73]}}}
    dkt = {"preset": "dkt", "auc": {"folds": [0.7, 0.7, 0.7]}}
    rows = report._paired_rows({"toy": {"akt-standard": control, "seq": leaky, "dkt": dkt}}, leaks={"seq"})
    assert len(rows) == 1                                        # dkt has no control; the control is no row
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[:5] == ["toy", "seq, history only", "akt-standard", "3", "-0.0033"]
    assert cells[-1] == "1"                                      # the control's fold 1 stopped at epoch 1
    assert cells[-3] == cells[-2]                                # one row: its Holm p is its p


def _scores(folds: list[float]) -> dict:
    """A toy metrics.json's scores: the same folds, mean and population std for AUC, ACC and RMSE."""
    mean = sum(folds) / len(folds)
    entry = {"folds": folds, "mean": mean, "std": math.sqrt(sum((f - mean) ** 2 for f in folds) / len(folds))}
    return {"auc": entry, "acc": entry, "rmse": entry}


def test_a_run_pairs_only_with_a_control_of_the_same_protocol(tmp_path):
    from training.config import RunConfig, to_dict
    from training.models.registry import preset_config
    runs = {"akt-standard": ("akt-standard", "recent", [0.70, 0.71]), "akt+protocol=chunks": ("akt", "chunks", [0.75, 0.77]),
            "routerkt-akt+protocol=chunks": ("routerkt-akt", "chunks", [0.74, 0.76])}
    for folder, (preset, protocol, folds) in runs.items():
        cfg = to_dict(RunConfig(preset=preset, model=preset_config(preset)))
        cfg["data"].update(protocol=protocol, path=f"/elsewhere/{folder}/toy.csv")   # the path's spelling does not count
        (tmp_path / "toy" / folder).mkdir(parents=True)
        (tmp_path / "toy" / folder / "config.json").write_text(json.dumps(cfg))
        (tmp_path / "toy" / folder / "metrics.json").write_text(json.dumps({"preset": preset, "folds": 2, **_scores(folds)}))
    runs_loaded, leaks = report._load(tmp_path)
    assert report._paired_rows(runs_loaded, leaks) == []        # the only control trained on `recent`
    chunks_control = json.loads((tmp_path / "toy" / "akt-standard" / "config.json").read_text())
    chunks_control["data"]["protocol"] = "chunks"
    (tmp_path / "toy" / "akt-standard+protocol=chunks").mkdir()
    (tmp_path / "toy" / "akt-standard+protocol=chunks" / "config.json").write_text(json.dumps(chunks_control))
    (tmp_path / "toy" / "akt-standard+protocol=chunks" / "metrics.json").write_text(
        json.dumps({"preset": "akt-standard", "folds": 2, **_scores([0.73, 0.74])}))
    rows = report._paired_rows(*report._load(tmp_path))
    cells = [[c.strip() for c in row.strip("|").split("|")][:5] for row in rows]
    assert cells == [["toy", "akt+protocol=chunks", "akt-standard+protocol=chunks", "2", "+0.0250"],
                     ["toy", "routerkt-akt+protocol=chunks", "akt-standard+protocol=chunks", "2", "+0.0150"]]
    text = report.render_report(tmp_path)                       # chunks runs: their own table, not ranked with `recent`
    auc = text.split("## AUC\n")[1].split("\n## ")[0]
    chunks = text.split("## AUC under the `chunks` protocol")[1].split("\n## ")[0]
    assert "| akt-standard |" in auc and "protocol=chunks" not in auc
    assert "| **0.7600 +- 0.0100 (2f)** |" in chunks and "| akt-standard |" not in chunks


def test_audited_runs_get_a_row_with_their_verdict(tmp_path):
    run = tmp_path / "toy" / "routerkt-akt"
    run.mkdir(parents=True)
    (run / "audit.json").write_text(json.dumps({
        "verdict": "PASS", "fold": 2, "probe": {"max_diff": 0.0}, "visible_answers": {"visible": 0, "scored": 10},
        "control": {"auc": 0.4982}}))
    assert report._audit_rows(tmp_path) == ["| toy | routerkt-akt | 2 | 0.0e+00 | 0 / 10 | 0.4982 | PASS |"]
    (run / "audit.json").write_text(json.dumps({
        "verdict": "PASS", "fold": 2, "probe": {"max_diff": 0.0}, "visible_answers": {"visible": 0, "scored": 10},
        "control": {"auc": 0.5218, "tolerance": 0.0654}}))
    assert report._audit_rows(tmp_path)[0].endswith("| 0.5218 (+-0.065) | PASS |")


def test_intro_follows_the_runs_split_batching_and_commands(tmp_path):
    from training.config import RunConfig, to_dict
    run = tmp_path / "toy" / "akt-standard"
    run.mkdir(parents=True)
    cfg = to_dict(RunConfig(preset="akt-standard"))
    cfg["data"]["folds_file"] = "toy/peer_folds.json"
    (run / "config.json").write_text(json.dumps(cfg))
    scores = {"mean": 0.7, "std": 0.0, "folds": [0.7]}
    (run / "metrics.json").write_text(json.dumps({"folds": 1, "preset": "akt-standard", "auc": scores,
                                                  "acc": scores, "rmse": scores}))
    (tmp_path / "REGENERATE.md").write_text("run the toy commands\n")
    text = report.render_report(tmp_path)
    assert "test learners of each fold from `toy/peer_folds.json`" in text and "5-fold cross-validation" not in text
    assert "former default" not in text                                  # neutral batching: no biased note
    assert "run the toy commands" in text and "--presets main" not in text
    cfg["train"]["batching"] = "length_bucketed"
    (run / "config.json").write_text(json.dumps(cfg))
    assert "former default" in report.render_report(tmp_path)


def test_every_preset_and_custom_run_gets_a_row(tmp_path):
    """The main tables list every preset (not only the `main` group: cl4kt-standard, alibi-cl4kt ...)
    and runs of other names after them; ablations stay in their own table."""
    scores = {"mean": 0.7, "std": 0.01, "folds": [0.7] * 5}
    for name in ("akt-standard", "cl4kt-standard", "routerkt-cl4kt-qn", "my-variant", "routerkt-akt+n_shared=0"):
        run = tmp_path / "toy" / name
        run.mkdir(parents=True)
        (run / "metrics.json").write_text(json.dumps({"folds": 5, "preset": name.split("+")[0], "auc": scores,
                                                      "acc": scores, "rmse": scores}))
    text = report.render_report(tmp_path)
    auc = text[text.index("## AUC"):text.index("## ACC")]
    rows = [line.split("|")[1].strip() for line in auc.splitlines() if line.startswith("| ") and "preset" not in line]
    assert rows == ["akt-standard", "cl4kt-standard", "routerkt-cl4kt-qn", "my-variant"]
