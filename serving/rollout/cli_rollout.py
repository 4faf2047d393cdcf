"""`routerkt rollout`: show and change the rollout policy, through a gateway or in its file.

    routerkt rollout status   [--gateway URL | --file F] [--json]
    routerkt rollout set      MODEL latest|pinned|canary|shadow [--version N] [--baseline N]
                              [--candidate N] [--weight W] [--sample S] [--min-outcomes M]
                              [--max-log-loss-increase X | --no-guardrail]
                              [--alpha A] [--promotion-min-outcomes M | --no-promotion]
                              [--gateway URL | --file F] [--json]
    routerkt rollout put      MODEL ENTRY_JSON [--gateway URL | --file F] [--json]   one whole entry (a restore)
    routerkt rollout promote  MODEL [--gateway URL | --file F] [--json]   canary/shadow -> pinned to the candidate
    routerkt rollout rollback MODEL [--gateway URL | --file F] [--json]   canary/shadow -> pinned to the baseline

With `--gateway` a change goes through the gateway's audited API (PUT /v1/rollout/MODEL, an admin
key): the gateway refuses a version its repository does not hold, loads one that is held but not
loaded, writes the file it watches and puts the change in force at once; `status` shows the policy
the gateway has in force, the file it watches, the routing as it is (`routing`), outcome counts and
each canary's sequential test. Without it, the file (default .routerkt/rollout.json, what
`routerkt serve` watches by default) is validated and written atomically; a gateway watching it picks
it up within rollout_poll_s (1 s). `--json` prints one JSON object (what `routerkt retrain` reads):
{"source", "file", "models": {MODEL: {"entry", "versions", "served", ...}}, ...}.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from routerkt.errors import UserError
from serving.rollout.kinds import KINDS
from serving.rollout.kinds.base import Rollout
from serving.rollout.kinds.pinned import Pinned
from serving.rollout.policy_file import PolicyError, parse_model
from serving.rollout.policy_source import DEFAULT_FILE, GatewaySource, PolicyFileSource, describe, make_rollout
from serving.security.client_flags import add_client_flags, api_key, https_context


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, parser_class=type(parser))
    sub.add_parser("status", help="the policy in force: a gateway's (--gateway) or the file's")
    change = sub.add_parser("set", help="set one model's policy")
    change.add_argument("model")
    change.add_argument("kind", choices=list(KINDS))
    for flag in _flags():
        change.add_argument("--" + flag.name.replace("_", "-"), type=flag.type, default=None, help=flag.help)
    change.add_argument("--min-outcomes", type=int, default=None, help="canary guardrail: outcomes per version")
    change.add_argument("--max-log-loss-increase", type=float, default=None,
                        help="canary guardrail: allowed candidate - baseline mean log loss")
    change.add_argument("--no-guardrail", action="store_true", help="canary without automatic rollback")
    change.add_argument("--alpha", type=float, default=None,
                        help="canary promotion: the sequential test's level (default 0.05)")
    change.add_argument("--promotion-min-outcomes", type=int, default=None,
                        help="canary promotion: outcomes per version before the test may decide (default 200)")
    change.add_argument("--no-promotion", action="store_true",
                        help="canary without promotion or rollback by the sequential test")
    change.add_argument("--note", default=None, help="free text kept with the entry (why it was set)")
    put = sub.add_parser("put", help="set one model's whole entry from its JSON (a restore; as status --json's entry)")
    put.add_argument("model")
    put.add_argument("entry", help='the entry, e.g. \'{"policy": "pinned", "version": 3}\'')
    for name, text in (("promote", "pin a canary's or shadow's candidate"),
                       ("rollback", "pin a canary's or shadow's baseline")):
        action = sub.add_parser(name, help=text)
        action.add_argument("model")
    for action in sub.choices.values():
        action.add_argument("--gateway", default=None, metavar="URL",
                            help="a gateway's HTTP base URL (HOST:PORT alone: http://, https:// with --tls-ca): "
                                 "read (and change, with an admin key) its policy through its API")
        action.add_argument("--file", type=Path, default=None,
                            help=f"policy file (default {DEFAULT_FILE}; a change takes --gateway or --file, not both)")
        action.add_argument("--json", action="store_true", help="print one JSON object")
        add_client_flags(action)


def run(args: argparse.Namespace) -> int:
    if args.gateway and args.file is not None and args.action != "status":
        raise UserError("--gateway and --file: a change goes through the gateway, which writes the file it watches; "
                        "give one of them")
    if args.action == "status":
        return _status(args)
    source = _gateway(args) if args.gateway else PolicyFileSource(args.file or DEFAULT_FILE)
    if args.action == "set":
        rollout = _build(args)
    elif args.action == "put":
        rollout = _entry(args.model, args.entry)
    else:
        current = source.rollout(args.model)
        split = current.split()
        if split is None:
            raise UserError(f"model {args.model} has a {current.name} policy: nothing to {args.action}")
        version = split.candidate if args.action == "promote" else split.baseline
        rollout = Pinned(version, note=f"{args.action}: {current.name} of {split.candidate} over {split.baseline}")
    in_force = source.change(args.model, rollout)
    if args.json:
        print(json.dumps({"source": source.name, "model": args.model, **describe(parse_model(args.model, in_force))}))
    else:
        print(f"{source.name}: {args.model}: {json.dumps(in_force)}")
    return 0


def _gateway(args: argparse.Namespace) -> GatewaySource:
    return GatewaySource(args.gateway, api_key(args), https_context(args))


def _flags():
    """Every kind's flags, each once (kinds share --baseline / --candidate); nested ones excluded."""
    seen = {}
    for kind in KINDS.values():
        for flag in kind.flags:
            if flag.type in (int, float):
                seen.setdefault(flag.name, flag)
    return list(seen.values())


def _build(args: argparse.Namespace) -> Rollout:
    given = {f.name: getattr(args, f.name) for f in _flags() if getattr(args, f.name) is not None}
    if args.no_promotion and (args.alpha is not None or args.promotion_min_outcomes is not None):
        raise UserError("--no-promotion: not with --alpha or --promotion-min-outcomes")
    options = {"no_guardrail": args.no_guardrail, "min_outcomes": args.min_outcomes,
               "max_log_loss_increase": args.max_log_loss_increase, "no_promotion": args.no_promotion,
               "alpha": args.alpha, "promotion_min_outcomes": args.promotion_min_outcomes}
    try:
        return make_rollout(args.model, args.kind, given, options, args.note)
    except PolicyError as exc:
        field = str(exc).split(":", 1)[0]
        flag = "promotion-min-outcomes" if field.endswith("promotion.min_outcomes") else \
            field.rsplit(".", 1)[-1].replace("_", "-")
        raise UserError(f"--{flag}: {str(exc).split(': ', 1)[-1]}") from None


def _entry(model: str, text: str) -> Rollout:
    try:
        return parse_model(model, json.loads(text))
    except ValueError as exc:                          # PolicyError is a ValueError, so is bad JSON
        raise UserError(f"entry: {exc}") from None


def _status(args: argparse.Namespace) -> int:
    views = []
    if args.file is not None or not args.gateway:
        views.append(PolicyFileSource(args.file or DEFAULT_FILE).status())
    if args.gateway:
        views.append(_gateway(args).status())
    if args.json:
        print(json.dumps(views[-1] if len(views) == 1 else {"views": views}))
        return 0
    for view in views:
        _print_view(view)
    return 0


def _print_view(view: dict) -> None:
    if view["source"].startswith("gateway"):
        state = "policy file refused: " + view["error"] if view.get("error") else "policy file in force"
        print(f"{view['source']}: watches {view.get('file') or 'no policy file (latest everywhere)'}; {state}")
    else:
        print(view["source"] + ("" if view["exists"] else " (absent: latest for every model; a gateway watching "
                                                          "another file is not shown here: use --gateway)"))
    for name, model in view["models"].items():
        routing = model.get("routing", {})
        extra = f"  [routed: {routing['note']}]" if routing.get("note") else ""
        print(f"  {name}: {json.dumps(model['entry'])}{extra}")
    for name, test in sorted(view.get("sequential_tests", {}).items()):
        print(f"  sequential test {name}: {_reading(test)}")
    for key, quality in sorted(view.get("quality", {}).items()):
        loss = quality.get("mean_log_loss")
        auc = quality.get("online_auc")
        print(f"  outcomes {key}: {quality['outcomes']}, mean log loss "
              f"{'-' if loss is None else f'{loss:.4f}'}, online AUC {'-' if auc is None else f'{auc:.4f}'}")


def _reading(test: dict) -> str:
    """One line of a canary's sequential test from /v1/rollout."""
    n, gap = test["outcomes"], test["difference"]
    verdict = {"promote": "candidate better: promoted", "rollback": "candidate worse: rolled back"}.get(
        test["decision"], "no decision yet (the split stays)")
    return (f"candidate {test['candidate']} - baseline {test['baseline']} mean clipped log loss in "
            f"[{gap['lower']:+.4f}, {gap['upper']:+.4f}] at confidence {1 - test['alpha']:g}, outcomes "
            f"{n['candidate']} / {n['baseline']} (min {test['min_outcomes']}): {verdict}")
