"""`routerkt reproduce` on a tiny synthetic 'dataset': runs, resumes without retraining, the
leaking whole-window variant is also scored on the history only, the diversity analysis and the
report are written."""
from __future__ import annotations

import argparse
import json

import pytest

from tests.conftest import TINY_OVERRIDES

pytestmark = pytest.mark.integration


def _args(tmp_path, **kw) -> argparse.Namespace:
    from training.cli import cli_reproduce
    parser = argparse.ArgumentParser()
    cli_reproduce.add_arguments(parser)
    argv = ["--datasets", "toy", "--root", str(tmp_path / "datasets"), "--out", str(tmp_path / "results"),
            "--folds", "2", "--only-folds", "1", "--epochs", "1"] + [x for o in TINY_OVERRIDES for x in ("--set", o)]
    for key, value in kw.items():
        argv += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return parser.parse_args(argv)


def test_reproduce_runs_resumes_and_reports(synthetic_csv, tmp_path):
    from training.cli import cli_reproduce as reproduce
    from training.eval.history_score import HISTORY_SCORING
    (tmp_path / "datasets" / "toy").mkdir(parents=True)
    (tmp_path / "datasets" / "toy" / "interactions.csv").write_bytes(synthetic_csv.read_bytes())
    presets = "routerkt-akt,akt-standard,dkt,routerkt-akt+model.routing_scope=sequence"
    assert reproduce.run(_args(tmp_path, presets=presets)) == 0
    results = tmp_path / "results" / "toy"
    metrics = json.loads((results / "routerkt-akt" / "metrics.json").read_text())
    assert metrics["folds"] == 1 and 0 < metrics["auc"]["mean"] <= 1
    leaky = results / "routerkt-akt+routing_scope=sequence"
    scored = json.loads((leaky / "history_only.json").read_text())
    assert scored["auc"]["mean"] > 0 and scored["scoring"] == HISTORY_SCORING
    (leaky / "history_only.json").write_text(json.dumps({"auc": {"mean": 0.99, "std": 0.0}}))   # an older cache
    stamp = (results / "akt-standard" / "fold-0" / "result.json").stat().st_mtime_ns
    assert reproduce.run(_args(tmp_path, presets=presets)) == 0                 # resumes: nothing retrained
    assert (results / "akt-standard" / "fold-0" / "result.json").stat().st_mtime_ns == stamp
    assert json.loads((leaky / "history_only.json").read_text()) == scored     # the stale score is recomputed
    assert reproduce.run(_args(tmp_path, presets=presets, only_folds=2)) == 0   # one more fold trained ...
    assert len(json.loads((leaky / "history_only.json").read_text())["auc"]["folds"]) == 2   # ... and scored
    # dkt has no attention: the analysis leaves it out instead of failing
    assert reproduce.run(_args(tmp_path, presets="routerkt-akt,akt-standard,dkt", diversity=True, learners=5)) == 0
    table = (results / "diversity" / "diversity.md").read_text()
    assert "| routerkt-akt |" in table and "| akt-standard |" in table and "| dkt |" not in table
    assert (results / "diversity" / "similarity_ssim.png").stat().st_size > 0
    report = (tmp_path / "results" / "RESULTS.md").read_text()
    assert "| preset | toy |" in report and "history only" in report and "Attention diversity: toy" in report
