"""Tests of training/report.py: the prose comes from report_template.md and the published numbers
from published_numbers.json, and the committed results/RESULTS.md is exactly what the report renders
from the committed runs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from training import report

pytestmark = pytest.mark.unit

RESULTS = Path(__file__).resolve().parents[2] / "results"


def test_template_parts_and_published_numbers_are_there():
    parts = report._template()
    assert {"intro", "ablations", "same_folds", "stalled", "diversity", "wall_time", "published"} <= set(parts)
    rows = json.loads(report.PUBLISHED.read_text())["rows"]
    table = report._published_table()
    assert len(table) == 2 + len(rows)
    assert "| pyKT leaderboard | 200-chunks, 20% test | ASSIST2009 | AKT / simpleKT / DKT | 0.7853 / 0.7744 / 0.7541 |" in table


def test_committed_results_md_is_what_the_report_renders():
    if not (RESULTS / "RESULTS.md").is_file():
        pytest.skip("no results/RESULTS.md")
    assert report.render_report(RESULTS) == (RESULTS / "RESULTS.md").read_text()


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
