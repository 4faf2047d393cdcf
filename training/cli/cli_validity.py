"""`routerkt validity`: served mastery and explanations against synthetic learners' truth; writes OUT/validity.json.

The measurement: training/eval/validity.py.

Exit code 0 with the numbers (whatever they are), 2 for bad input (one line).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from routerkt.errors import UserError
from training.data.synthetic import SyntheticConfig
from training.eval.validity import AT_END, NEXT, PIVOTAL, RECENT, ValidityConfig, validity_run

_SYNTH = SyntheticConfig()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", required=True, help="training run directory (written by `routerkt train`)")
    p.add_argument("--data", default=None, help="the run's synthetic CSV (default: the run's recorded data.path)")
    p.add_argument("--fold", type=int, default=None, help="fold checkpoint (default: best validation AUC)")
    p.add_argument("--learners", type=int, default=200, metavar="N",
                   help="at most N of the fold's test learners, a seeded sample (default %(default)s)")
    p.add_argument("--top-k", type=int, default=5, help="history positions an explanation names (default %(default)s)")
    p.add_argument("--cuts", type=int, default=20, metavar="N",
                   help="steps per learner whose actual question is an explained candidate (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the learner sample and the steps (default %(default)s)")
    p.add_argument("--out", default=None, metavar="DIR", help="where validity.json goes (default: the run directory)")
    p.add_argument("--batch-size", type=int, default=64)
    synth = p.add_argument_group("the `routerkt synth` parameters the data was made with (checked against the file)")
    synth.add_argument("--synth-seed", type=int, default=_SYNTH.seed, help="synth --seed (default %(default)s)")
    synth.add_argument("--skills", type=int, default=_SYNTH.n_skills, help="synth --skills (default %(default)s)")
    synth.add_argument("--questions", type=int, default=_SYNTH.n_questions,
                       help="synth --questions (default %(default)s)")
    synth.add_argument("--min-len", type=int, default=_SYNTH.min_len, help="synth --min-len (default %(default)s)")
    synth.add_argument("--max-len", type=int, default=_SYNTH.max_len, help="synth --max-len (default %(default)s)")


def _num(value: float | None, fmt: str = ".3f") -> str:
    return "-" if value is None else format(value, fmt)


def _print_mastery(m: dict) -> None:
    print(f"mastery vs the generator's true mastery, Spearman ({m['skills']} skills):")
    print(f"  {'':34} {'learners':>8} {'mean':>7} {'std':>6} {'p10':>7} {'median':>7} {'p90':>7}")
    for label, key in (("per learner, all skills", "per_learner_all_skills"),
                       ("per learner, practised (model)", "per_learner_practised"),
                       ("per learner, practised (counting)", "per_learner_practised_counting")):
        s = m[key]
        print(f"  {label:34} {s['n']:>8} {_num(s.get('mean')):>7} {_num(s.get('std')):>6} {_num(s.get('p10')):>7} "
              f"{_num(s.get('median')):>7} {_num(s.get('p90')):>7}")
    a, b = m["pooled_all_skills"], m["pooled_practised"]
    print(f"  pooled (learner, skill): all skills {_num(a['spearman'])} over {a['pairs']} pairs "
          f"(mean |model - truth| {_num(a['mean_abs_error'])}); practised {_num(b['spearman'])} "
          f"(counting {_num(b['counting_spearman'])}) over {b['pairs']} pairs")
    d = m["dependent_skills"]
    print(f"  dependent skills {d['skills']}, mean P(correct) after / before the unlock: model "
          f"{_num(d['model_mean_unlocked'])} / {_num(d['model_mean_locked'])}, "
          f"truth {_num(d['truth_mean_unlocked'])} / {_num(d['truth_mean_locked'])} "
          f"({d['learners_unlocked']} learners unlocked)")


def _print_explanations(e: dict, top_k: int) -> None:
    if "skipped" in e:
        print(f"explanations: skipped ({e['skipped']})")
        return
    print(f"explanations: top-{top_k} history positions hold the target")
    print(f"  {'candidate':14} {'target':18} {'cases':>6} {'model':>7} {'+-se':>6} {'random':>7} "
          f"{f'last {top_k}':>7} {'window':>7} {'outside':>8}")
    for kind in (NEXT, AT_END):
        for target in (RECENT, PIVOTAL):
            r = e[kind][target]
            print(f"  {kind:14} {target:18} {r['cases']:>6} {_num(r['hit_rate']):>7} {_num(r['stderr']):>6} "
                  f"{_num(r['random_baseline']):>7} {_num(r['recency_baseline']):>7} "
                  f"{_num(r['mean_window_used'], '.1f'):>7} {r['outside_window']:>8}")


def run(args: argparse.Namespace) -> int:
    if args.learners < 1 or args.top_k < 1 or args.cuts < 0 or args.batch_size < 1:
        raise UserError("--learners, --top-k and --batch-size must be >= 1, --cuts >= 0")
    synth = SyntheticConfig(seed=args.synth_seed, n_skills=args.skills, n_questions=args.questions,
                            min_len=args.min_len, max_len=args.max_len)
    cfg = ValidityConfig(run=Path(args.run), data=args.data, fold=args.fold, learners=args.learners,
                         top_k=args.top_k, cuts=args.cuts, seed=args.seed, batch_size=args.batch_size, synth=synth,
                         out=Path(args.out) if args.out else None)
    report = validity_run(cfg)
    print(f"validity of {report['checkpoint']} ({report['preset']}) on {report['learners']} of "
          f"{report['test_learners']} held-out test learners of {report['data']}, window {report['window']}")
    _print_mastery(report["mastery"])
    _print_explanations(report["explanations"], report["top_k"])
    print(f"-> {Path(args.out or args.run) / 'validity.json'} ({report['seconds']} s)")
    return 0
