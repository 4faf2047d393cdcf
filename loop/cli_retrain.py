"""`routerkt retrain`: retrain on the store's events, gate offline against the served version, publish as a canary.

The events are the gateway's session store's; the new version is published only past the offline gate
(loop/retrain/run.py)."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from loop.retrain.run import CANARY_PATIENCE, DEFAULT_POLICY_FILE, MARGIN, WEIGHT, RetrainOptions
from loop.retrain.train import EPOCHS
from routerkt.errors import UserError
from routerkt.flag_groups import add_client_flags, add_store_credentials


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", required=True,
                   help="the gateway's session store: sqlite:///PATH, redis://HOST:PORT/DB, rediss://USER@HOST:PORT/DB")
    p.add_argument("--repository", type=Path, required=True, help="the Triton model repository the gateway serves")
    p.add_argument("--model", required=True, help="model name in the repository")
    p.add_argument("--preset", default=None,
                   help="preset to train (default: the served version's, with its run's configuration when found)")
    p.add_argument("--cutoff", default=None, metavar="T",
                   help="held-out events: each learner's from its first event at or after T (ms since the epoch or "
                        "ISO 8601); default: the time before which 80%% of the timed events lie")
    p.add_argument("--warm-start", action=argparse.BooleanOptionalAction, default=True,
                   help="start from the served version's weights (rows of known ids copied, new ones fresh) when "
                        "its run is found under --runs (default: on; docs/learning-loop.md)")
    p.add_argument("--margin", type=float, default=MARGIN,
                   help=f"publish only when held-out log loss < served - margin (default {MARGIN})")
    p.add_argument("--weight", type=float, default=WEIGHT,
                   help=f"canary share of learners for the new version (default {WEIGHT})")
    p.add_argument("--epochs", type=int, default=EPOCHS,
                   help=f"maximum epochs (early stopping, patience 3; default {EPOCHS})")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config field, as `routerkt train --set` (e.g. train.device=cuda)")
    p.add_argument("--runs", type=Path, default=Path("runs"),
                   help="folder of training runs: where the served version's run is looked for")
    p.add_argument("--out", type=Path, default=None,
                   help="this retrain's run folder and report (default RUNS/retrain-MODEL-TIME)")
    p.add_argument("--gateway", default=None, metavar="URL",
                   help="the gateway's HTTP base URL (or HOST:PORT): the policy is read and changed through its "
                        "audited API (an admin key: --api-key-file or $ROUTERKT_API_KEY), and the canary starts once "
                        "it serves the new version")
    p.add_argument("--policy-file", type=Path, default=None,
                   help="without --gateway: the rollout policy file the gateway watches "
                        f"(default {DEFAULT_POLICY_FILE})")
    add_client_flags(p, ca_flag="--gateway-ca-file")         # the gateway's admin key and CA
    p.add_argument("--canary-patience", type=int, default=CANARY_PATIENCE, metavar="N",
                   help="an undecided canary keeps running (exit 3) until its candidate has N outcomes; then the new "
                        f"model must beat the better of its two versions (default {CANARY_PATIENCE}; needs --gateway)")
    p.add_argument("--load-timeout", type=float, default=300.0,
                   help="seconds to wait for --gateway to load the new version")
    add_store_credentials(p)
    p.add_argument("--keep-data", action="store_true",
                   help="keep the exported events.csv and train.csv in OUT/.data (folder 0700, files 0600)")
    p.add_argument("--json", action="store_true",
                   help="print the report as one JSON object (report.json) instead of the table")


def run(args: argparse.Namespace) -> int:
    from loop.retrain.report import write_report
    from loop.retrain.run import retrain
    from routerkt.timestamps import parse_time
    # under --runs, where the next warm start finds it
    out = args.out or args.runs / f"retrain-{args.model}-{time.strftime('%Y%m%d-%H%M%S')}"
    opts = RetrainOptions(store=args.store, repository=args.repository, model=args.model, out=out, runs=args.runs,
                          policy_file=args.policy_file, preset=args.preset,
                          cutoff_ms=parse_time(args.cutoff, "--cutoff"),
                          warm_start=args.warm_start, margin=args.margin, weight=args.weight, epochs=args.epochs,
                          overrides=args.overrides, gateway=args.gateway, gateway_ca_file=args.gateway_ca_file,
                          api_key_file=args.api_key_file, canary_patience=args.canary_patience,
                          load_timeout_s=args.load_timeout, store_password_file=args.store_password_file,
                          store_ca_file=args.store_ca_file, keep_data=args.keep_data)
    started = time.monotonic()

    def log(message: str) -> None:                     # progress on stderr, seconds since the start
        print(f"[{time.monotonic() - started:7.1f}s] {message}", file=sys.stderr, flush=True)

    try:
        code, report = retrain(opts, log)
    except UserError:
        raise
    except Exception as exc:              # one line, whatever broke; the repository and policy are as they were
        first = (str(exc).splitlines() or [""])[0][:300]
        raise UserError(f"retrain failed: {type(exc).__name__}: {first}") from None
    table = write_report(report, out)
    if args.json:
        from dataclasses import asdict
        import json
        print(json.dumps(asdict(report)))
    else:
        print(table, end="")
    return code
