"""Validity of served mastery and explanations on synthetic learners whose truth is known (`routerkt validity`).

The run's data must be a file `routerkt synth` wrote; the command regenerates it from the synth
parameters (checked: the regenerated interactions must equal the file's, else a one-line error) and
with it each learner's hidden truth (training/data/synthetic_truth.py). Only the fold's held-out TEST
learners (DIR/folds.json) are measured: the model never trained on them. The model input is what the
server builds: raw ids through the run's vocabulary, the last window - 1 interactions left-padded.

Mastery: the model's P(correct) for (UNK_ID, {s}) after the whole history (serving/queries/mastery.py) for
every skill, against the true P(correct) on an average question of s at the next step. Spearman
per learner (over all skills; over the skills practised in the window the model saw, next to a
counting baseline: the learner's correct rate per skill in that window) and pooled over
(learner, skill) pairs.

Explanations (models with attention): the server's ranking of history positions,
sum_h w_h a_h / sum_h w_h of the last retriever layer, ties oldest first; a hit when its top-k holds
a target. Candidates: "next question", the learner's actual interaction at `cuts` seeded steps t
(history: the steps before t), and "skill at end", (UNK_ID, {s}) for every skill after the whole
history (the Mastery forward). Targets: (a) the last practice of the candidate's skill (its gap
drives forgetting), (b) for a dependent skill after the unlock, the three correct skill-0 answers
that unlocked it. A case counts when a target lies in the window. Baselines: the exact expected hit
rate of k positions drawn at random among the window's interactions (1 - C(n-m, k) / C(n, k) for m
targets among n), and the k most recent positions.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from scipy.stats import rankdata

from routerkt.atomic import atomic_write_json
from routerkt.contract.signature import PAD_ID, PAD_RESPONSE, UNK_ID
from routerkt.contract.vocab import Vocab
from routerkt.errors import UserError
from training.checkpoint import Checkpoint, load_checkpoint
from training.data.csv_reader import read_interactions
from training.data.pipeline import resolve_data_path
from training.data.synthetic import SyntheticConfig
from training.data.synthetic_truth import LearnerTruth, learner_truths
from training.models.explain_forward import explain_rank
from training.training_run import best_fold_dir

RECENT, PIVOTAL = "recent_same_skill", "pivotal"
NEXT, AT_END = "next_question", "skill_at_end"
MIN_SKILLS = 3               # a per-learner Spearman needs this many skills


@dataclass
class ValidityConfig:
    run: Path
    data: str | None = None          # default: the run's recorded data.path
    fold: int | None = None          # default: the best fold (as export serves)
    learners: int = 200              # at most this many test learners (seeded sample)
    top_k: int = 5
    cuts: int = 20                   # next-question candidates per learner
    seed: int = 0
    batch_size: int = 64
    synth: SyntheticConfig = field(default_factory=SyntheticConfig)   # n_learners: from the file
    out: Path | None = None          # default: the run directory


# ----------------------------------------------------------------------------------------------
# Statistics

def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rho with average ranks for ties; nan when either side is constant or too short."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.size < MIN_SKILLS or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(np.corrcoef(rankdata(a), rankdata(b))[0, 1])


def spread(values: list[float]) -> dict:
    """n, mean, std and the 10/50/90th percentiles of the finite values."""
    v = np.asarray([x for x in values if math.isfinite(x)], dtype=np.float64)
    if not v.size:
        return {"n": 0}
    p10, p50, p90 = np.percentile(v, [10, 50, 90])
    return {"n": int(v.size), "mean": float(v.mean()), "std": float(v.std()), "p10": float(p10),
            "median": float(p50), "p90": float(p90)}


def mean(values: list[float]) -> float:
    return float(np.mean(values)) if len(values) else float("nan")


def truth_unlocked(truth: LearnerTruth) -> bool:
    """Whether the learner unlocked the dependent skills by the end of the history."""
    return truth.pivotal_for(min(truth.world.dependent), truth.length).size > 0


def random_hit_probability(n: int, m: int, k: int) -> float:
    """P(k positions drawn without replacement among n hold at least one of m targets)."""
    k = min(k, n)
    return 1.0 - math.comb(n - m, k) / math.comb(n, k)


def top_positions(attention: np.ndarray, head_weights: np.ndarray, k: int) -> np.ndarray:
    """The server's top-k of history positions: attention [heads, n] averaged with head_weights [heads]
    (plain mean when they sum to 0), largest first, ties oldest first."""
    total = float(head_weights.sum())
    weight = head_weights @ attention / total if total > 0 else attention.mean(axis=0)
    return np.lexsort((np.arange(weight.size), -weight))[:k]


# ----------------------------------------------------------------------------------------------
# Learners

def _regenerate(path: Path, synth: SyntheticConfig) -> list[LearnerTruth]:
    """The truths of the learners of `path`, refused unless `synth` regenerates its interactions."""
    inter = read_interactions(path)
    if inter.max_skills > 1:
        raise UserError(f"{path}: multi-skill interactions; validity reads single-skill synthetic files only")
    cfg = dataclasses.replace(synth, n_learners=int(inter.user_id.max()) + 1 if len(inter) else 0,
                              multi_skill=0.0, expanded=False)
    df, truths = learner_truths(cfg)
    same = len(df) == len(inter) and all(
        np.array_equal(df[name].to_numpy(), ours) for name, ours in
        (("user_id", inter.user_id), ("question_id", inter.question_id), ("skill_id", inter.skill_id[:, 0]),
         ("correct", inter.correct)))
    if not same:
        raise UserError(f"{path}: not what `routerkt synth --learners {cfg.n_learners} --seed {cfg.seed} --skills "
                        f"{cfg.n_skills} --questions {cfg.n_questions} --min-len {cfg.min_len} --max-len "
                        f"{cfg.max_len}` writes; pass the parameters it was made with (--synth-seed, --skills, ...)")
    return truths


def _test_learners(run_dir: Path, fold: int) -> np.ndarray:
    path = run_dir / "folds.json"
    try:
        entries = json.loads(path.read_text())
        return next(np.asarray(e["test"], dtype=np.int64) for e in entries if int(e["fold"]) == fold)
    except FileNotFoundError:
        raise UserError(f"{path}: missing; validity measures the fold's test learners") from None
    except (ValueError, KeyError, TypeError, StopIteration) as exc:
        raise UserError(f"{path}: no readable fold {fold} ({type(exc).__name__})") from None


# ----------------------------------------------------------------------------------------------
# Model inputs and forwards

@dataclass
class Histories:
    questions: np.ndarray    # int64 [B, H] left-padded model ids
    skills: np.ndarray       # int64 [B, H]
    responses: np.ndarray    # int64 [B, H]
    starts: np.ndarray       # int64 [B] the step of each row's oldest used interaction
    used: np.ndarray         # int64 [B] interactions in each row


def padding(b: int, length: int) -> Histories:
    """`b` history rows of padding only."""
    return Histories(np.full((b, length), PAD_ID, dtype=np.int64), np.full((b, length), PAD_ID, dtype=np.int64),
                     np.full((b, length), PAD_RESPONSE, dtype=np.int64), np.zeros(b, dtype=np.int64),
                     np.zeros(b, dtype=np.int64))


def histories(rows: list[tuple[LearnerTruth, int]], vocab: Vocab, length: int) -> Histories:
    """The rank graph's history rows of (learner, step t): the last `length` interactions before t."""
    out = padding(len(rows), length)
    for i, (truth, t) in enumerate(rows):
        start = max(0, t - length)
        n = t - start
        out.starts[i], out.used[i] = start, n
        if n:
            out.questions[i, length - n:] = vocab.encode_questions(truth.questions[start:t])
            out.skills[i, length - n:] = vocab.encode_skills(truth.skills[start:t])
            out.responses[i, length - n:] = truth.correct[start:t]
    return out


@dataclass
class Forward:
    probs: np.ndarray                  # [B, N]
    attention: np.ndarray | None       # [B, N, heads, H] or None (no attention: DKT)
    head_weights: np.ndarray | None    # [B, N, heads]


def forward(model, h: Histories, candidate_questions: np.ndarray, candidate_skills: np.ndarray,
            explain: bool) -> Forward:
    """The rank forward (with the explain graph's attention when `explain`), as the server runs it."""
    inputs = [torch.from_numpy(a) for a in (h.questions, h.skills, h.responses, candidate_questions,
                                            candidate_skills)]
    with torch.inference_mode():
        if not explain:
            return Forward(torch.sigmoid(model.rank(*inputs)).numpy(), None, None)
        out = explain_rank(model, *inputs)
        return Forward(torch.sigmoid(out.logits).numpy(), out.attention.numpy(), out.head_weights.numpy())


def has_attention(model, length: int) -> bool:
    """Whether explain_rank can explain `model` (DKT cannot)."""
    unknown = np.full((1, 1), UNK_ID, dtype=np.int64)
    try:
        forward(model, padding(1, length), unknown, unknown, True)
    except ValueError:
        return False
    return True


# ----------------------------------------------------------------------------------------------
# Explanation hits

@dataclass
class HitTally:
    """Cases of one (candidate kind, target) with the model's hits and both baselines."""

    hits: list[bool] = field(default_factory=list)
    random: list[float] = field(default_factory=list)
    recency: list[bool] = field(default_factory=list)
    used: list[int] = field(default_factory=list)
    outside_window: int = 0            # cases whose target lies before the window the model saw

    def add(self, top: np.ndarray, targets: np.ndarray, n: int, k: int) -> None:
        self.hits.append(bool(np.isin(targets, top).any()))
        self.random.append(random_hit_probability(n, int(targets.size), k))
        self.recency.append(bool((targets >= n - k).any()))
        self.used.append(n)

    def report(self) -> dict:
        cases = len(self.hits)
        rate = mean(self.hits)
        return {"cases": cases, "hit_rate": rate,
                "stderr": math.sqrt(rate * (1 - rate) / cases) if cases else float("nan"),
                "random_baseline": mean(self.random), "recency_baseline": mean(self.recency),
                "mean_window_used": mean(self.used), "outside_window": self.outside_window}


def tally_case(tallies: dict[str, HitTally], truth: LearnerTruth, skill: int, t: int, start: int, n: int,
               attention: np.ndarray, head_weights: np.ndarray, k: int) -> None:
    """Score one candidate of raw `skill` at step t whose history row holds steps start..t-1 (n of them,
    the last n of attention's [heads, H] slots) against both targets."""
    if n == 0:
        return
    top = top_positions(attention[:, attention.shape[1] - n:], head_weights, k)
    recent = truth.last_practice(skill, t)
    pivotal = truth.pivotal_for(skill, t)
    for name, steps in ((RECENT, np.array([recent]) if recent >= 0 else np.zeros(0, dtype=np.int64)),
                        (PIVOTAL, pivotal)):
        if not steps.size:
            continue
        inside = steps[steps >= start] - start
        if inside.size:
            tallies[name].add(top, inside, n, k)
        else:
            tallies[name].outside_window += 1


# ----------------------------------------------------------------------------------------------
# Mastery

@dataclass
class MasteryTally:
    """Model vs true mastery over learners: per-learner Spearman, pooled pairs, the dependent skills."""

    dependent: np.ndarray                                               # bool [S] over the measured skills
    per_learner: dict[str, list[float]] = field(default_factory=lambda: {"all": [], "practised": [], "counting": []})
    pooled: dict[str, list[float]] = field(default_factory=lambda: {
        "model": [], "truth": [], "model_p": [], "truth_p": [], "counting_p": []})
    unlock: dict[str, list[float]] = field(default_factory=lambda: {
        f"{side}_mean_{state}": [] for side in ("model", "truth") for state in ("unlocked", "locked")})

    def add(self, model: np.ndarray, truth: np.ndarray, counting: np.ndarray, unlocked: bool) -> None:
        """One learner: model and true mastery [S], its correct rate per skill in the window (nan: not practised)."""
        practised = np.isfinite(counting)
        self.per_learner["all"].append(spearman(model, truth))
        self.per_learner["practised"].append(spearman(model[practised], truth[practised]))
        self.per_learner["counting"].append(spearman(counting[practised], truth[practised]))
        for name, values in (("model", model), ("truth", truth), ("model_p", model[practised]),
                             ("truth_p", truth[practised]), ("counting_p", counting[practised])):
            self.pooled[name].extend(values)
        state = "unlocked" if unlocked else "locked"
        self.unlock[f"model_mean_{state}"].extend(model[self.dependent])
        self.unlock[f"truth_mean_{state}"].extend(truth[self.dependent])

    def report(self) -> dict:
        p = {name: np.asarray(v, dtype=np.float64) for name, v in self.pooled.items()}
        return {
            "per_learner_all_skills": spread(self.per_learner["all"]),
            "per_learner_practised": spread(self.per_learner["practised"]),
            "per_learner_practised_counting": spread(self.per_learner["counting"]),
            "pooled_all_skills": {"pairs": int(p["model"].size), "spearman": spearman(p["model"], p["truth"]),
                                  "mean_abs_error": float(np.abs(p["model"] - p["truth"]).mean())},
            "pooled_practised": {"pairs": int(p["model_p"].size), "spearman": spearman(p["model_p"], p["truth_p"]),
                                 "counting_spearman": spearman(p["counting_p"], p["truth_p"])},
            "dependent_skills": {name: mean(values) for name, values in self.unlock.items()},
        }


def counting_rates(truth: LearnerTruth, start: int, skills: np.ndarray) -> np.ndarray:
    """The learner's correct rate per skill over steps start.. (nan where the skill is not practised there)."""
    seen, correct = truth.skills[start:], truth.correct[start:]
    return np.array([correct[seen == s].mean() if (seen == s).any() else np.nan for s in skills])


# ----------------------------------------------------------------------------------------------
# The measurement

def _batches(items: list, size: int):
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _next_question_cases(truths: list[LearnerTruth], cuts: int, seed: int) -> list[tuple[LearnerTruth, int]]:
    """Per learner, up to `cuts` seeded steps t >= 1 whose actual interaction is the candidate."""
    rng = np.random.default_rng([seed, 1])
    return [(truth, int(t)) for truth in truths if truth.length > 1
            for t in np.sort(rng.choice(np.arange(1, truth.length), min(cuts, truth.length - 1), replace=False))]


def measure(ckpt: Checkpoint, truths: list[LearnerTruth], cfg: ValidityConfig) -> dict:
    """Mastery and explanation results of `ckpt` on `truths` (module docstring)."""
    model, vocab = ckpt.model.eval(), ckpt.vocab
    length = ckpt.config.data.window - 1
    explain = has_attention(model, length)
    raw_skills = np.array([s for s in range(truths[0].n_skills) if s in vocab.skills], dtype=np.int64)
    skill_ids = vocab.encode_skills(raw_skills)
    dependent = np.isin(raw_skills, sorted(truths[0].world.dependent))
    tallies = {kind: {RECENT: HitTally(), PIVOTAL: HitTally()} for kind in (NEXT, AT_END)}
    mastery = MasteryTally(dependent=dependent)

    for batch in _batches(truths, cfg.batch_size):              # the Mastery forward: (UNK_ID, {s}) after it all
        h = histories([(truth, truth.length) for truth in batch], vocab, length)
        cands = np.broadcast_to(skill_ids, (len(batch), skill_ids.size)).copy()
        out = forward(model, h, np.full_like(cands, UNK_ID), cands, explain)
        for i, truth in enumerate(batch):
            start, n = int(h.starts[i]), int(h.used[i])
            mastery.add(out.probs[i].astype(np.float64), truth.mastery[raw_skills],
                        counting_rates(truth, start, raw_skills), truth_unlocked(truth))
            for j, s in enumerate(raw_skills if explain else []):
                tally_case(tallies[AT_END], truth, int(s), truth.length, start, n, out.attention[i, j],
                           out.head_weights[i, j], cfg.top_k)

    for batch in _batches(_next_question_cases(truths, cfg.cuts, cfg.seed) if explain else [], cfg.batch_size):
        h = histories(batch, vocab, length)
        questions = vocab.encode_questions(np.array([truth.questions[t] for truth, t in batch])).reshape(-1, 1)
        skills = vocab.encode_skills(np.array([truth.skills[t] for truth, t in batch])).reshape(-1, 1)
        out = forward(model, h, questions, skills, True)
        for i, (truth, t) in enumerate(batch):
            tally_case(tallies[NEXT], truth, int(truth.skills[t]), t, int(h.starts[i]), int(h.used[i]),
                       out.attention[i, 0], out.head_weights[i, 0], cfg.top_k)

    report = mastery.report()
    report["skills"] = int(raw_skills.size)
    report["dependent_skills"].update(skills=[int(x) for x in raw_skills[dependent]],
                                      learners_unlocked=sum(truth_unlocked(truth) for truth in truths))
    explanations = ({kind: {name: t.report() for name, t in targets.items()} for kind, targets in tallies.items()}
                    if explain else {"skipped": f"{type(model).__name__} has no attention layer to explain"})
    return {"mastery": report, "explanations": explanations}


def finite(obj: object) -> object:
    """`obj` with every non-finite float as None (JSON has no NaN)."""
    if isinstance(obj, dict):
        return {key: finite(value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [finite(value) for value in obj]
    return None if isinstance(obj, float) and not math.isfinite(obj) else obj


def validity_run(cfg: ValidityConfig) -> dict:
    """Measure `cfg.run` (module docstring), write OUT/validity.json and return what it holds."""
    started = time.perf_counter()
    run_dir = Path(cfg.run)
    if not run_dir.is_dir():
        raise UserError(f"--run {run_dir}: not a directory")
    fold_dir = run_dir / f"fold-{cfg.fold}" if cfg.fold is not None else best_fold_dir(run_dir)
    ckpt = load_checkpoint(fold_dir)
    if ckpt.config.model.leaks_future:
        raise UserError(f"{fold_dir}: the model routes over the whole window (leaks_future): no history-once ranking")
    length = ckpt.config.data.window - 1
    if not 1 <= cfg.top_k <= length:
        raise UserError(f"--top-k must be in 1..{length} (the model's window - 1), got {cfg.top_k}")
    data_path = resolve_data_path(cfg.data or ckpt.config.data.path)
    truths = _regenerate(data_path, cfg.synth)
    fold = int(ckpt.meta.get("fold", cfg.fold if cfg.fold is not None else fold_dir.name.split("-")[-1]))
    test = _test_learners(run_dir, fold)
    test = test[(test >= 0) & (test < len(truths))]
    if not test.size:
        raise UserError(f"{data_path}: holds none of fold {fold}'s test learners; is it the run's data?")
    chosen = np.sort(np.random.default_rng(cfg.seed).choice(test, min(cfg.learners, test.size), replace=False))
    result = measure(ckpt, [truths[int(u)] for u in chosen], cfg)
    report = {"checkpoint": str(fold_dir), "fold": fold, "preset": ckpt.config.preset,
              "backbone": ckpt.config.model.backbone.value, "data": str(data_path),
              "synth": {"seed": cfg.synth.seed, "skills": cfg.synth.n_skills, "questions": cfg.synth.n_questions,
                        "min_len": cfg.synth.min_len, "max_len": cfg.synth.max_len, "learners": len(truths)},
              "test_learners": int(test.size), "learners": int(chosen.size), "window": ckpt.config.data.window,
              "top_k": cfg.top_k, "cuts": cfg.cuts, "seed": cfg.seed, **result,
              "seconds": round(time.perf_counter() - started, 1)}
    out = Path(cfg.out) if cfg.out is not None else run_dir
    out.mkdir(parents=True, exist_ok=True)
    report = finite(report)
    atomic_write_json(out / "validity.json", report)
    return report
