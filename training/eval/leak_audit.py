"""A leak audit of a trained run: perturbation probe, visible answers, shuffled-label control
(`routerkt audit`: training/cli/cli_audit.py).

The audited checkpoint is the run's best fold (highest validation AUC, as export serves) or
`--fold K`. Its data are rebuilt by the one pipeline (training/data/pipeline.py) from `--data`
(default: the run's recorded data.path) with the run's own DataConfig (protocol, window,
skill_rows, ...) and vocabulary; the fold's learners come from DIR/folds.json (else the
split is recomputed from the config). Three checks, each written to DIR/audit.json:

(a) Perturbation probe on the trained weights (dropout off). For a seeded sample of the fold's test
    windows (`--probe-windows`, only windows with >= 2 real positions) one cut t is drawn uniformly
    among the real positions before the last. The copy of the window gets every response at
    positions >= t flipped (the answer at t is the label of position t, so it must be invisible as
    well) and every question and skill (each used slot of a skill set) at positions > t replaced by
    a random real id. The check
    value is max |p - p'| over the real positions <= t of every sampled window (probabilities,
    float32). It must be <= 1e-6 (`PROBE_TOL`). The same maximum over the positions > t is reported
    as `max_diff_after_cut`: it shows the probe moves predictions at all (0 there means the probe
    proved nothing). A model config with `ModelConfig.leaks_future` (the paper's whole-window
    routing) is not causal by design: its probe value is reported, and the verdict is
    LEAKS BY DESIGN, never PASS.

(b) Visible answers in the run's own test sequences. The model input at a scored position p holds
    the question at p and the responses at positions < p; p's answer is visible when the
    interaction at p is a copy of the one at p-1. Definition: a scored position p (real, not
    padding) is VISIBLE when p-1 is a real position of the same window and
        question[p] == question[p-1]  (a known question: not padding, not the unknown id),
        response[p] == response[p-1], and
        the skill sets at p and p-1 share no skill
    i.e. the same interaction written again under another skill tag: the rows that expanded
    multi-skill files hold (assist2009), which the default `data.skill_rows=merge` merges into one
    interaction (training/data/skill_rows.py) and `data.skill_rows=expand` keeps. `visible_share` =
    visible / scored positions of the test sequences; it must be <= 0.1% (`VISIBLE_MAX_SHARE`,
    `--visible-threshold`).
    A repeat with the same question, skill set and answer cannot be told from a genuine immediate retry
    (the canonical CSV has no timestamp; `order` strictly increases), and genuine retries are common
    (the synthetic generator: ~5% of rows), so those are reported as `identical_repeat_share`
    (with `identical_repeat_agreement`, the share of same-question same-skill-set consecutive pairs
    whose answers agree) for a human to judge, and do not enter the verdict.

(c) Shuffled-label control. The audited fold is trained again with the run's model and training
    config (same protocol, seed, batch size; `--control-epochs` epochs, default 3) after the
    `correct` values of its training sequences are permuted among their real positions (seeded),
    and likewise, separately, those of its validation sequences (so early stopping cannot select on
    real labels) and of its test sequences. Questions, skills, windows and padding stay as they were.
    Without a leak no model can beat chance on the permuted test answers: the test AUC must lie in
    0.5 +- tolerance; a model that reads the answer it predicts still predicts the permuted one and
    scores far above. The tolerance is 0.02 (`CONTROL_TOL`) or 3 null stds (`CONTROL_SIGMAS`),
    whichever is wider, where `null_std` is the AUC's standard deviation under no signal
    (Hanley-McNeil) on this test set. 0.02 is 3 null stds at roughly 7,500-9,000 scored
    positions; on a smaller test set a fixed 0.02 band fails causal models by chance (700
    positions: null std 0.022, outside +-0.02 about a third of the time), with 3 stds ~0.3% of
    the time, and a leak still shows (a model reading its own answer scores ~0.9+). (Scored on the
    REAL test answers instead, a barely trained control is a random function of features that do
    predict them, above all the learner's past answers, and lands anywhere in roughly 0.44-0.56 on
    real data: assist2009, the official fold 1, routerkt-akt: 0.4384, with no leak found by (a) or
    (b).) `--skip-control` leaves it out; the verdict then covers (a) and (b) only and says so.

Verdict: PASS when every check run passes; LEAKS BY DESIGN when the model config leaks by design and
(b), (c) pass; else FAIL with the reasons.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

from routerkt.contract.signature import PAD_ID

PROBE_TOL = 1e-6
VISIBLE_MAX_SHARE = 0.001
CONTROL_TOL = 0.02           # the control's band floor: 0.5 +- 0.02 ...
CONTROL_SIGMAS = 3.0         # ... or 3 null stds of the test set's AUC, whichever is wider
PASS, FAIL, LEAKS = "PASS", "FAIL", "LEAKS BY DESIGN"
FIRST_REAL_ID = 2            # ids 0 (padding) and 1 (unknown) are not real questions or skills


# ----------------------------------------------------------------------------------------------
# (a) perturbation probe

def perturbation_probe(model, seqs, n_questions: int, n_skills: int, n_windows: int, seed: int = 0,
                       batch_size: int = 256) -> dict:
    """Max |prediction change| at positions <= t when responses >= t and questions/skills > t change
    (definition: module docstring, (a)); `n_questions`/`n_skills`: vocabulary sizes of the model."""
    import torch

    rng = np.random.default_rng(seed)
    n_q, n_s = n_questions, n_skills
    eligible = np.flatnonzero(seqs.lengths >= 2)
    rows = np.sort(rng.choice(eligible, size=min(n_windows, eligible.size), replace=False))
    W = seqs.window
    q, s, r = seqs.questions[rows], seqs.skills[rows], seqs.responses[rows]
    first = W - seqs.lengths[rows]
    cut = rng.integers(first, W - 1)                             # in [first real, W-2]
    pos = np.arange(W)[None, :]
    real = r >= 0
    flip = real & (pos >= cut[:, None])
    later = real & (pos > cut[:, None])
    r_moved = np.where(flip, 1 - r, r)
    q_moved = np.where(later, rng.integers(FIRST_REAL_ID, max(n_q, FIRST_REAL_ID + 1), q.shape), q)
    s_moved = np.where(later[:, :, None] & (s != PAD_ID),
                       rng.integers(FIRST_REAL_ID, max(n_s, FIRST_REAL_ID + 1), s.shape), s)
    model.eval()
    before, after = 0.0, 0.0
    with torch.no_grad():
        for start in range(0, rows.size, batch_size):
            batch = slice(start, start + batch_size)
            base = torch.sigmoid(model(*(torch.from_numpy(a[batch]) for a in (q, s, r))).logits.float()).numpy()
            moved = torch.sigmoid(model(*(torch.from_numpy(a[batch]) for a in (q_moved, s_moved, r_moved)))
                                  .logits.float()).numpy()
            diff = np.abs(moved - base)
            upto = real[batch] & ~later[batch]
            before = max(before, float(diff[upto].max(initial=0.0)))
            after = max(after, float(diff[later[batch]].max(initial=0.0)))
    return {"windows": int(rows.size), "max_diff": before, "max_diff_after_cut": after, "tolerance": PROBE_TOL}


# ----------------------------------------------------------------------------------------------
# (b) visible answers

def _share_a_skill(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[S, W'] bool: the skill sets a[s, w] and b[s, w] ([S, W', K]) have a skill in common."""
    return ((a[..., :, None] == b[..., None, :]) & (a != PAD_ID)[..., :, None]).any(axis=(-2, -1))


def visible_answers(seqs) -> dict:
    """Counts of scored positions whose answer the input shows (definition: module docstring, (b))."""
    q, s, r = seqs.questions, seqs.skills, seqs.responses
    real = r >= 0
    pair = real[:, 1:] & real[:, :-1]                        # p and p-1 both real
    same_q = pair & (q[:, 1:] == q[:, :-1]) & (q[:, 1:] >= FIRST_REAL_ID)
    same_r = r[:, 1:] == r[:, :-1]
    same_s = (s[:, 1:] == s[:, :-1]).all(axis=-1)                 # the same skill set
    visible = same_q & same_r & ~_share_a_skill(s[:, 1:], s[:, :-1])
    identical = same_q & same_r & same_s
    retries = same_q & same_s
    scored = int(real.sum())
    share = lambda n: float(n) / scored if scored else float("nan")
    return {"scored": scored, "visible": int(visible.sum()), "visible_share": share(visible.sum()),
            "identical_repeats": int(identical.sum()), "identical_repeat_share": share(identical.sum()),
            "identical_repeat_agreement": float(identical.sum()) / int(retries.sum()) if retries.any() else None,
            "same_question_other_answer": int((same_q & ~same_r).sum())}


# ----------------------------------------------------------------------------------------------
# (c) shuffled-label control

def permute_labels(seqs, rng: np.random.Generator):
    """`seqs` with the responses of its real positions permuted among them; all else unchanged."""
    responses = seqs.responses.copy()
    real = responses >= 0
    responses[real] = rng.permutation(responses[real])
    return dataclasses.replace(seqs, responses=responses)


def null_auc_std(labels: np.ndarray) -> float:
    positives = int((labels >= 0.5).sum())
    negatives = int(labels.size - positives)
    if not (positives and negatives):
        return float("nan")
    return math.sqrt((negatives + positives + 1) / (12.0 * negatives * positives))


def control_tolerance(null_std: float) -> float:
    """Half-width of the control's band: CONTROL_TOL, widened to CONTROL_SIGMAS null stds on small test sets."""
    return max(CONTROL_TOL, CONTROL_SIGMAS * null_std) if math.isfinite(null_std) else CONTROL_TOL


def shuffled_control(cfg, vocab, train, valid, test, fold: int, epochs: int, seed: int, log) -> dict:
    from training.checkpoint import load_checkpoint
    from training.fold_training import FoldData, predict, train_fold
    from training.metrics import summarize

    cfg = copy.deepcopy(cfg)
    cfg.train.epochs = epochs
    rng = np.random.default_rng(seed)
    test = permute_labels(test, rng)
    data = FoldData(train=permute_labels(train, rng), valid=permute_labels(valid, rng), test=test)
    with tempfile.TemporaryDirectory(prefix="routerkt-audit-") as tmp:
        result = train_fold(cfg, vocab, data, Path(tmp) / "control", fold, "audit-control", log=log, progress=False)
        model = load_checkpoint(Path(tmp) / "control").model
        labels, probs = predict(model, test, cfg.train.batch_size)
    metrics = summarize(labels, probs)
    null_std = null_auc_std(labels)
    return {"epochs": epochs, "epochs_run": result["epochs_run"], "auc": metrics["auc"], "n": metrics["n"],
            "null_std": null_std, "tolerance": control_tolerance(null_std)}


# ----------------------------------------------------------------------------------------------

def verdict(leaks_by_design: bool, probe: dict, visible: dict, threshold: float,
            control: dict | None) -> tuple[str, list[str]]:
    reasons = []
    if not leaks_by_design and not probe["max_diff"] <= PROBE_TOL:
        reasons.append(f"(a) predictions at positions <= t change by {probe['max_diff']:.3g} > {PROBE_TOL:g} "
                       f"when later answers/questions change")
    if not visible["visible_share"] <= threshold:
        reasons.append(f"(b) {visible['visible_share']:.3%} of scored answers are visible in the input "
                       f"(> {threshold:.3%}; trained with data.skill_rows=expand? the default merge "
                       f"reads each multi-skill interaction once)")
    if control is not None and not abs(control["auc"] - 0.5) <= control["tolerance"]:   # band set by the control itself
        reasons.append(f"(c) the shuffled-label control scores test AUC {control['auc']:.4f}, "
                       f"outside 0.5 +- {control['tolerance']:.3f}")
    if reasons:
        return FAIL, reasons
    return (LEAKS if leaks_by_design else PASS), reasons


def _fold_learners(run_dir: Path, index: int, data_cfg, seqs):
    from routerkt.errors import UserError
    from training.data.pipeline import split_folds
    path = run_dir / "folds.json"
    if path.is_file():
        try:
            for entry in json.loads(path.read_text()):
                if int(entry["fold"]) == index:
                    return (np.asarray(entry["train"], dtype=np.int64), np.asarray(entry["valid"], dtype=np.int64),
                            np.asarray(entry["test"], dtype=np.int64))
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(f"{path}: unreadable folds file ({exc})") from None
        raise UserError(f"{path}: no fold {index}")
    folds = split_folds(data_cfg, seqs)
    if index >= len(folds):
        raise UserError(f"{run_dir}: fold {index} is not among the {len(folds)} folds of its config")
    return folds[index].train, folds[index].valid, folds[index].test


def audit_run(run_dir: Path, fold: int | None = None, data: str | None = None, probe_windows: int = 256,
              visible_threshold: float = VISIBLE_MAX_SHARE, control_epochs: int = 3, skip_control: bool = False,
              seed: int = 0, batch_size: int = 256) -> dict:
    """Audit fold `fold` of `run_dir` (default: the best one) on `data` (default: the run's recorded
    data.path), write DIR/audit.json and return what it holds (module docstring)."""
    from routerkt.atomic import atomic_write_json
    from routerkt.errors import UserError
    from training.checkpoint import load_checkpoint
    from training.config import to_dict
    from training.data.pipeline import load_sequences
    from training.training_run import best_fold_dir

    fold_dir = run_dir / f"fold-{fold}" if fold is not None else best_fold_dir(run_dir)
    ckpt = load_checkpoint(fold_dir)
    index = int(ckpt.meta.get("fold", fold if fold is not None else fold_dir.name.split("-")[-1]))
    data_path = str(data) if data else ckpt.config.data.path
    data_cfg = dataclasses.replace(ckpt.config.data, path=data_path)
    _, seqs = load_sequences(data_cfg, ckpt.vocab)
    train_ids, valid_ids, test_ids = _fold_learners(run_dir, index, data_cfg, seqs)
    test = seqs.select_learners(test_ids)
    if len(test) == 0:
        raise UserError(f"{data_path}: holds none of fold {index}'s test learners; is it the run's data?")
    if not (test.lengths >= 2).any():
        raise UserError(f"{data_path}: no test window of fold {index} has two interactions to probe")
    leaks_by_design = ckpt.config.model.leaks_future
    log = lambda m: print(m, file=sys.stderr)

    probe = perturbation_probe(ckpt.model, test, ckpt.config.model.n_questions, ckpt.config.model.n_skills,
                               probe_windows, seed, batch_size)
    probe["leaks_by_design"] = leaks_by_design
    visible = visible_answers(test)
    visible["threshold"] = visible_threshold
    visible["skill_rows"] = data_cfg.skill_rows.value
    control = None
    if not skip_control:
        control = shuffled_control(ckpt.config, ckpt.vocab, seqs.select_learners(train_ids),
                                   seqs.select_learners(valid_ids), test, index, control_epochs, seed, log)
    result, reasons = verdict(leaks_by_design, probe, visible, visible_threshold, control)
    report = {"verdict": result, "reasons": reasons, "checkpoint": str(fold_dir), "fold": index, "data": data_path,
              "preset": ckpt.config.preset, "model": to_dict(ckpt.config.model), "test_sequences": len(test),
              "probe": probe, "visible_answers": visible,
              "control": control if control is not None else {"skipped": True}}
    atomic_write_json(run_dir / "audit.json", report)
    return report
