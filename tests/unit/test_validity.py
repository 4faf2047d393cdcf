"""Tests of the synthetic truth (training/data/synthetic_truth.py) and `routerkt validity` (training/eval/validity.py):
the truth is the generator's, the baselines are their closed forms, the command runs on a tiny model."""
from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr

from routerkt import cli
from training.data.synthetic import (BASE_LOGIT, KNOWLEDGE_SCALE, PIVOT_BONUS, PIVOT_PENALTY, PIVOT_SKILL, RETAINED,
                                     SyntheticConfig, simulate)
from training.data.synthetic_truth import learner_truths
from training.eval.validity import (PIVOTAL, RECENT, HitTally, random_hit_probability, spearman, tally_case,
                               top_positions)

pytestmark = pytest.mark.unit

CFG = SyntheticConfig(n_learners=40, seed=5)


@pytest.fixture(scope="module")
def truths():
    return learner_truths(CFG)


def test_truth_comes_from_the_same_simulation_as_the_file(truths):
    df, _ = truths
    assert df.equals(simulate(CFG)[0])


def test_the_truth_recomputes_the_probability_each_answer_was_drawn_with(truths):
    _, learners = truths
    for truth in learners[:6]:
        assert truth.state_at(truth.length) == truth.final
        for t in range(truth.length):
            state = truth.state_at(t)
            q, s = int(truth.questions[t]), int(truth.skills[t])
            p = 1.0 / (1.0 + math.exp(-state.logit(s, truth.world.difficulty[q], t, truth.world.dependent)))
            assert p == truth.p_correct[t]
    p = np.concatenate([t.p_correct for t in learners])
    correct = np.concatenate([t.correct for t in learners])
    assert abs(correct.mean() - p.mean()) < 3 * math.sqrt((p * (1 - p)).sum()) / p.size


def test_true_mastery_is_the_docstring_formula(truths):
    _, learners = truths
    for truth in learners[:10]:
        state, T = truth.final, truth.length
        unlocked = truth.pivotal.size == 3
        expected = []
        for s in range(truth.n_skills):
            seen = state.last_seen[s]
            decay = RETAINED + (1 - RETAINED) * math.exp(-(T - seen) / state.tau)
            k_eff = 0.0 if seen < 0 else state.knowledge[s] * decay
            pivot = (PIVOT_BONUS if unlocked else PIVOT_PENALTY) if s in truth.world.dependent else 0.0
            expected.append(1 / (1 + math.exp(-(state.theta + KNOWLEDGE_SCALE * k_eff + pivot + BASE_LOGIT))))
        np.testing.assert_allclose(truth.mastery, expected, rtol=0, atol=1e-12)
        np.testing.assert_allclose(truth.mastery_at(T), truth.mastery, rtol=0, atol=1e-12)


def test_pivotal_and_recent_same_skill(truths):
    _, learners = truths
    unlocked = [t for t in learners if t.pivotal.size == 3]
    assert unlocked
    for truth in unlocked:
        steps = truth.pivotal
        assert (truth.skills[steps] == PIVOT_SKILL).all() and (truth.correct[steps] == 1).all()
        assert truth.state_at(int(steps[-1])).pivot_correct == 2
        assert truth.state_at(int(steps[-1]) + 1).pivot_correct == 3
        dependent = min(truth.world.dependent)
        assert truth.pivotal_for(dependent, int(steps[-1])).size == 0          # not yet unlocked at that step
        assert list(truth.pivotal_for(dependent, int(steps[-1]) + 1)) == list(steps)
        assert truth.pivotal_for(PIVOT_SKILL, truth.length).size == 0         # not a dependent skill
    truth = learners[0]
    t = truth.length
    for s in range(truth.n_skills):
        last = truth.last_practice(s, t)
        assert last == truth.final.last_seen[s]


def test_random_baseline_is_its_closed_form():
    for n, m, k in [(1, 1, 5), (7, 1, 3), (7, 3, 3), (10, 3, 5), (6, 2, 6)]:
        hits = [bool(set(c) & set(range(m))) for c in itertools.combinations(range(n), min(k, n))]
        assert random_hit_probability(n, m, k) == pytest.approx(np.mean(hits), abs=1e-12)
    rng = np.random.default_rng(0)
    draws = [bool((rng.choice(40, 5, replace=False) < 3).any()) for _ in range(20000)]
    assert random_hit_probability(40, 3, 5) == pytest.approx(np.mean(draws), abs=0.01)
    assert random_hit_probability(40, 1, 5) == pytest.approx(5 / 40)


def test_top_positions_weights_heads_and_breaks_ties_oldest_first():
    attention = np.array([[0.1, 0.5, 0.1, 0.3],
                          [0.6, 0.0, 0.2, 0.2]])
    assert list(top_positions(attention, np.array([1.0, 0.0]), 2)) == [1, 3]
    assert list(top_positions(attention, np.array([0.0, 1.0]), 2)) == [0, 2]          # 0.2 tie: position 2 before 3
    assert list(top_positions(attention, np.array([0.0, 0.0]), 1)) == [0]             # no weight: plain mean
    assert list(top_positions(np.full((2, 4), 0.25), np.ones(2), 3)) == [0, 1, 2]


def test_spearman():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=30), rng.normal(size=30)
    b[:5] = b[5]                                                                      # ties
    assert spearman(a, b) == pytest.approx(spearmanr(a, b).statistic, abs=1e-12)
    assert math.isnan(spearman(a, np.ones(30))) and math.isnan(spearman(a[:2], b[:2]))


def test_a_case_hits_when_attention_points_at_the_target(truths):
    _, learners = truths
    truth = next(t for t in learners if t.length > 30)
    t = truth.length
    skill = int(truth.skills[t - 5])
    recent = truth.last_practice(skill, t)
    start, n, heads, window = t - 20, 20, 2, 24
    tallies = {RECENT: HitTally(), PIVOTAL: HitTally()}
    attention = np.zeros((heads, window))
    attention[:, window - n + (recent - start)] = 1.0                                # one-hot on the target
    tally_case(tallies, truth, skill, t, start, n, attention, np.ones(heads), 1)
    attention = np.zeros((heads, window))
    attention[:, window - n + (recent - start + 1) % n] = 1.0                         # elsewhere
    tally_case(tallies, truth, skill, t, start, n, attention, np.ones(heads), 1)
    report = tallies[RECENT].report()
    assert report["cases"] == 2 and report["hit_rate"] == 0.5
    assert report["random_baseline"] == pytest.approx(1 / n)


def _validity(run: Path, out: Path, *extra: str) -> dict:
    assert cli.main(["validity", "--run", str(run), "--synth-seed", "3", "--learners", "12", "--cuts", "4",
                     "--out", str(out), *extra]) == 0
    return json.loads((out / "validity.json").read_text())


def test_command_on_a_tiny_run(tiny_run, tmp_path, capsys):
    report = _validity(tiny_run, tmp_path)
    assert "mastery vs the generator's true mastery" in capsys.readouterr().out
    assert report["learners"] == 12 and report["synth"]["learners"] == 160
    m = report["mastery"]
    assert m["skills"] == 20 and m["pooled_all_skills"]["pairs"] == 12 * 20
    for key in ("per_learner_all_skills", "per_learner_practised"):
        assert m[key]["n"] >= 6 and all(-1 <= m[key][q] <= 1 for q in ("p10", "mean", "median", "p90"))
    assert -1 <= m["pooled_all_skills"]["spearman"] <= 1 and 0 < m["pooled_all_skills"]["mean_abs_error"] < 1
    dependent = m["dependent_skills"]
    assert dependent["skills"] == [1, 2, 3, 4, 5] and 0 < dependent["learners_unlocked"] <= 12
    assert 0 < dependent["model_mean_unlocked"] < 1 and 0 < dependent["truth_mean_unlocked"] < 1
    for kind in ("next_question", "skill_at_end"):
        recent = report["explanations"][kind][RECENT]
        assert recent["cases"] > 0
        assert 0 <= recent["hit_rate"] <= 1 and 0 < recent["random_baseline"] <= 1
        assert 0 <= recent["recency_baseline"] <= 1
    assert report["explanations"]["next_question"][RECENT]["cases"] <= 12 * 4


def test_dkt_reports_mastery_only(synthetic_csv, tmp_path):
    from tests.conftest import train_tiny
    run = train_tiny(synthetic_csv, tmp_path / "dkt", preset="dkt", epochs=1)
    report = _validity(run, tmp_path / "out")
    assert "skipped" in report["explanations"]
    assert -1 <= report["mastery"]["pooled_all_skills"]["spearman"] <= 1


def test_bad_input_is_one_line_exit_2(tiny_run, tmp_path, capsys):
    assert cli.main(["validity", "--run", str(tiny_run), "--synth-seed", "4", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not what `routerkt synth --learners 160 --seed 4" in err
    assert cli.main(["validity", "--run", str(tmp_path / "nope")]) == 2
    assert cli.main(["validity", "--run", str(tiny_run), "--synth-seed", "3", "--top-k", "20"]) == 2
    assert not (tmp_path / "validity.json").exists()
