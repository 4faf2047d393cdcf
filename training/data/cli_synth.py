"""`routerkt synth`: write a synthetic learner dataset as a canonical CSV (see training/data/synthetic.py)."""
from __future__ import annotations

import argparse

from training.data.synthetic import SyntheticConfig, simulate, write_csv

_DEFAULTS = SyntheticConfig()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, metavar="PATH",
                   help="CSV to write (a .gz name is gzip-compressed); written atomically")
    p.add_argument("--learners", type=int, default=_DEFAULTS.n_learners, metavar="N",
                   help="number of learners (default %(default)s)")
    p.add_argument("--seed", type=int, default=_DEFAULTS.seed, metavar="S",
                   help="random seed; the same seed gives the same file (default %(default)s)")
    p.add_argument("--skills", type=int, default=_DEFAULTS.n_skills, metavar="K",
                   help="number of skills, skill 0 is pivotal (default %(default)s)")
    p.add_argument("--questions", type=int, default=_DEFAULTS.n_questions, metavar="Q",
                   help="number of questions, >= skills (default %(default)s)")
    p.add_argument("--min-len", type=int, default=_DEFAULTS.min_len, metavar="N",
                   help="fewest interactions per learner (default %(default)s)")
    p.add_argument("--max-len", type=int, default=_DEFAULTS.max_len, metavar="N",
                   help="most interactions per learner (default %(default)s)")
    p.add_argument("--multi-skill", type=float, default=_DEFAULTS.multi_skill, metavar="SHARE",
                   help="share of questions tagged with a second skill (default %(default)s: none)")
    p.add_argument("--expanded", action="store_true",
                   help="write a multi-skill interaction as one row per skill, as expanded files do "
                        "(default: one row, skill_id 'a;b')")


def run(args: argparse.Namespace) -> int:
    cfg = SyntheticConfig(n_learners=args.learners, n_skills=args.skills, n_questions=args.questions,
                          min_len=args.min_len, max_len=args.max_len, seed=args.seed,
                          multi_skill=args.multi_skill, expanded=args.expanded)
    df, _ = simulate(cfg)  # validates the flags (UserError)
    write_csv(df, args.out)
    print(f"synth: wrote {cfg.n_learners:,} learners, {len(df):,} {'rows' if cfg.expanded else 'interactions'} "
          f"(correct rate {df['correct'].mean():.3f}) to {args.out}")
    return 0
