"""`routerkt audit` on the tiny run: the perturbation probe on trained weights, visible answers in
duplicated rows, the shuffled-label control, the verdict and the exit codes."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def run_copy(tiny_run: Path, tmp_path: Path) -> Path:
    """The session's tiny run copied, so audit.json does not land in the shared fixture."""
    return Path(shutil.copytree(tiny_run, tmp_path / "run"))


def _audit(*argv: str) -> int:
    from routerkt.cli import main
    return main(["audit", *argv])


@pytest.fixture(scope="module")
def expanded_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Synthetic learners, 30% of the questions tagged with a second skill, written as expanded files
    write them: one row per skill (same learner, question and answer)."""
    from training.data.synthetic import generate, write_csv
    path = tmp_path_factory.mktemp("expanded") / "expanded.csv"
    write_csv(generate(n_learners=160, seed=3, multi_skill=0.3, expanded=True), path)
    return path


def test_clean_tiny_run_passes_probe_and_visible_checks(run_copy: Path, synthetic_csv: Path, capsys):
    rc = _audit("--run", str(run_copy), "--data", str(synthetic_csv), "--skip-control")
    report = json.loads((run_copy / "audit.json").read_text())
    assert {"probe", "visible_answers", "control"} <= report.keys()
    assert report["probe"]["windows"] > 0
    assert report["probe"]["max_diff"] <= 1e-6
    assert report["probe"]["max_diff_after_cut"] > 1e-4           # the probe does move later predictions
    assert report["visible_answers"]["visible"] == 0
    assert report["visible_answers"]["scored"] > 0
    assert report["control"] == {"skipped": True}
    assert rc == 0 and report["verdict"] == "PASS"
    assert "verdict: PASS" in capsys.readouterr().out


@pytest.mark.parametrize("skill_rows, verdict", [("expand", "FAIL"), ("merge", "PASS")])
def test_expanded_rows_are_visible_unless_merged(expanded_csv: Path, tmp_path: Path, capsys, skill_rows, verdict):
    """A run trained with the merge turned off (data.skill_rows=expand, the former default) sees the
    answer of every second row of a multi-skill interaction: (b) FAILs. The default merge passes."""
    from tests.conftest import train_tiny
    extra = [] if skill_rows == "merge" else [f"data.skill_rows={skill_rows}"]
    run = train_tiny(expanded_csv, tmp_path / skill_rows, extra=extra, epochs=1)
    rc = _audit("--run", str(run), "--skip-control")
    report = json.loads((run / "audit.json").read_text())
    visible = report["visible_answers"]
    assert visible["skill_rows"] == skill_rows and report["verdict"] == verdict
    if verdict == "FAIL":
        assert visible["visible"] > 0 and visible["visible_share"] > 0.05     # ~1/4 of rows are a second skill's
        assert rc == 1 and any(r.startswith("(b)") and "skill_rows=expand" in r for r in report["reasons"])
    else:
        assert visible["visible"] == 0 and visible["scored"] > 0 and rc == 0
        assert report["probe"]["max_diff"] <= 1e-6
    assert f"verdict: {verdict}" in capsys.readouterr().out


def test_visible_answers_definition():
    from training.eval.leak_audit import visible_answers
    from training.data.protocol import Sequences
    # one window of 7, two padding positions; position 3 repeats 2 (another skill): visible;
    # 5 repeats 4 with the same skill (a retry: not judged); 6 repeats 5's question, other answer
    q = np.array([[0, 0, 5, 5, 7, 7, 7]])
    s = np.array([[0, 0, 2, 3, 4, 4, 4]])[..., None]                  # skill sets of one: [S, W, 1]
    r = np.array([[-1, -1, 1, 1, 0, 0, 1]])
    seqs = Sequences(questions=q, skills=s, responses=r, lengths=np.array([5]), learners=np.array([1]))
    out = visible_answers(seqs)
    assert out["scored"] == 5 and out["visible"] == 1 and out["visible_share"] == pytest.approx(0.2)
    assert out["identical_repeats"] == 1 and out["same_question_other_answer"] == 1
    # sets: {2,3} then {4} (no shared skill): visible; {4} then {4,5} (shares 4): neither; {4,5} twice: identical
    q = np.array([[5, 5, 7, 7, 7]])
    s = np.array([[[2, 3], [4, 0], [4, 0], [4, 5], [4, 5]]])
    r = np.array([[1, 1, 0, 0, 0]])
    out = visible_answers(Sequences(questions=q, skills=s, responses=r, lengths=np.array([5]), learners=np.array([1])))
    assert out["visible"] == 1 and out["identical_repeats"] == 1


def test_probe_catches_a_leaking_model(synthetic_csv: Path):
    import dataclasses

    import torch

    from tests.conftest import TINY_OVERRIDES
    from training.eval.leak_audit import perturbation_probe
    from training.config import RoutingScope, RunConfig, apply_overrides
    from training.data.pipeline import load_sequences
    from training.models.registry import build_model, preset_config, with_vocab

    cfg = apply_overrides(RunConfig(preset="routerkt-akt", model=preset_config("routerkt-akt")), TINY_OVERRIDES)
    cfg.data.path = str(synthetic_csv)
    vocab, seqs = load_sequences(cfg.data)
    model_cfg = dataclasses.replace(with_vocab(cfg.model, vocab.n_questions, vocab.n_skills), max_len=cfg.data.window,
                                    routing_scope=RoutingScope.SEQUENCE)
    assert model_cfg.leaks_future
    torch.manual_seed(0)
    model = build_model(model_cfg).eval()
    probe = perturbation_probe(model, seqs, model_cfg.n_questions, model_cfg.n_skills, n_windows=32)
    assert probe["max_diff"] > 1e-6


def test_verdict_rules():
    from training.eval.leak_audit import CONTROL_TOL, FAIL, LEAKS, PASS, verdict
    clean = {"max_diff": 0.0}
    leaky = {"max_diff": 1e-3}
    seen = {"visible_share": 0.0}
    ok, off = {"auc": 0.51, "tolerance": CONTROL_TOL}, {"auc": 0.53, "tolerance": CONTROL_TOL}
    assert verdict(False, clean, seen, 1e-3, ok) == (PASS, [])
    assert verdict(False, clean, seen, 1e-3, None) == (PASS, [])
    assert verdict(True, leaky, seen, 1e-3, ok) == (LEAKS, [])
    assert verdict(False, leaky, seen, 1e-3, ok)[0] == FAIL
    assert verdict(False, clean, {"visible_share": 0.002}, 1e-3, ok)[0] == FAIL
    status, reasons = verdict(False, clean, seen, 1e-3, off)
    assert status == FAIL and reasons[0].startswith("(c)")
    assert verdict(False, clean, seen, 1e-3, {"auc": float("nan"), "tolerance": CONTROL_TOL})[0] == FAIL
    # a small test set widens the band to 3 null stds; 0.53 then passes, 0.57 still fails
    assert verdict(False, clean, seen, 1e-3, {"auc": 0.53, "tolerance": 0.066}) == (PASS, [])
    assert verdict(False, clean, seen, 1e-3, {"auc": 0.57, "tolerance": 0.066})[0] == FAIL


def test_control_band_widens_with_the_null_std_only_on_small_test_sets():
    from training.eval.leak_audit import CONTROL_TOL, control_tolerance, null_auc_std
    small = np.array([1] * 350 + [0] * 350)            # 700 positions: null std ~0.022
    large = np.array([1] * 70_000 + [0] * 30_000)
    assert abs(control_tolerance(null_auc_std(small)) - 3 * null_auc_std(small)) < 1e-12
    assert 0.06 < control_tolerance(null_auc_std(small)) < 0.07
    assert control_tolerance(null_auc_std(large)) == CONTROL_TOL
    assert control_tolerance(float("nan")) == CONTROL_TOL      # one class only: no null std


def test_shuffled_label_control_is_computed(run_copy: Path, synthetic_csv: Path):
    """On the tiny test set (~600 positions) chance alone moves the AUC by ~0.02, so this checks the
    control is trained and scored on permuted answers over the whole test fold, not the 0.5 +- tolerance bound
    (test_verdict_rules checks the bound)."""
    import dataclasses

    from training.eval.leak_audit import permute_labels
    from training.checkpoint import load_checkpoint
    from training.data.pipeline import load_sequences

    ckpt = load_checkpoint(run_copy / "fold-0")
    _, seqs = load_sequences(dataclasses.replace(ckpt.config.data, path=str(synthetic_csv)), ckpt.vocab)
    shuffled = permute_labels(seqs, np.random.default_rng(0))
    real = seqs.responses >= 0
    assert np.array_equal(shuffled.responses >= 0, real)                      # padding untouched
    assert np.sort(shuffled.responses[real]).tolist() == np.sort(seqs.responses[real]).tolist()
    assert (shuffled.responses[real] != seqs.responses[real]).any()
    assert np.array_equal(shuffled.questions, seqs.questions)

    rc = _audit("--run", str(run_copy), "--data", str(synthetic_csv), "--control-epochs", "1")
    report = json.loads((run_copy / "audit.json").read_text())
    control = report["control"]
    assert control["epochs"] == 1 and control["epochs_run"] == 1
    assert np.isfinite(control["auc"]) and 0.0 <= control["auc"] <= 1.0
    assert control["n"] == report["visible_answers"]["scored"]               # scored on the whole test fold
    assert 0 < control["null_std"] < 0.1
    assert control["tolerance"] >= 0.02
    passed = abs(control["auc"] - 0.5) <= control["tolerance"]
    assert (rc == 0) == passed and report["verdict"] == ("PASS" if passed else "FAIL")


def test_bad_input_is_one_line_exit_2(run_copy: Path, tmp_path: Path, capsys):
    assert _audit("--run", str(tmp_path / "missing")) == 2
    other = tmp_path / "other.csv"
    other.write_text("user_id,order,question_id,skill_id,correct\n" + "".join(f"99999,{i},1,1,{i % 2}\n" for i in range(8)))
    assert _audit("--run", str(run_copy), "--data", str(other), "--skip-control") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("routerkt audit: error:") for line in err)
