"""`routerkt rollout`: show and change the rollout policy file the gateway watches.

    routerkt rollout status   [--file F] [--gateway http://127.0.0.1:8080]
    routerkt rollout set      MODEL latest|pinned|canary|shadow [--version N] [--baseline N]
                              [--candidate N] [--weight W] [--sample S] [--min-outcomes M]
                              [--max-log-loss-increase X | --no-guardrail]
                              [--alpha A] [--promotion-min-outcomes M | --no-promotion] [--file F]
    routerkt rollout promote  MODEL [--file F]     canary/shadow -> pinned to the candidate
    routerkt rollout rollback MODEL [--file F]     canary/shadow -> pinned to the baseline

The file defaults to .routerkt/rollout.json (what `routerkt serve` watches by default); every
change is validated like the gateway does and written atomically; the gateway picks it up within
rollout_poll_s (1 s). `status --gateway URL` also prints what that gateway has in force (a refused
file's error included), its outcome counts per version and each canary's sequential test (its
interval for candidate - baseline log loss and its decision so far; GET /v1/rollout).
"""
from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from pathlib import Path

from routerkt.errors import UserError
from serving.security.client_flags import add_client_flags, api_key, https_context
from serving.rollout.kinds import KINDS
from serving.rollout.kinds.pinned import Pinned
from serving.rollout.policy_file import PolicyError, RolloutPolicyFile, parse_model, read_policy, write_policy

DEFAULT_FILE = Path(".routerkt") / "rollout.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, parser_class=type(parser))
    status = sub.add_parser("status", help="print the policy file (and a gateway's view with --gateway)")
    status.add_argument("--gateway", default=None, metavar="URL", help="a gateway's HTTP base URL")
    add_client_flags(status)
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
    for name, text in (("promote", "pin a canary's or shadow's candidate"),
                       ("rollback", "pin a canary's or shadow's baseline")):
        action = sub.add_parser(name, help=text)
        action.add_argument("model")
    for action in sub.choices.values():
        action.add_argument("--file", type=Path, default=DEFAULT_FILE, help=f"policy file (default {DEFAULT_FILE})")


def run(args: argparse.Namespace) -> int:
    try:
        policy = read_policy(args.file)
    except PolicyError as exc:
        if args.action != "set":
            raise UserError(f"{args.file}: {exc}") from None
        raise UserError(f"{args.file} is malformed ({exc}); fix or remove it first") from None
    if args.action == "status":
        return _status(args, policy)
    if args.action == "set":
        rollout = _build(args)
    else:
        current = policy.get(args.model)
        split = current.split()
        if split is None:
            raise UserError(f"model {args.model} has a {current.name} policy: nothing to {args.action}")
        version = split.candidate if args.action == "promote" else split.baseline
        rollout = Pinned(version, note=f"{args.action}: {current.name} of {split.candidate} over {split.baseline}")
    models = dict(policy.models)
    models[args.model] = rollout
    write_policy(args.file, RolloutPolicyFile(models))
    print(f"{args.file}: {args.model}: {json.dumps(rollout.to_json())}")
    return 0


def _flags():
    """Every kind's flags, each once (kinds share --baseline / --candidate); nested ones excluded."""
    seen = {}
    for kind in KINDS.values():
        for flag in kind.flags:
            if flag.type in (int, float):
                seen.setdefault(flag.name, flag)
    return list(seen.values())


def _build(args: argparse.Namespace):
    kind = KINDS[args.kind]
    given = {f.name: getattr(args, f.name) for f in _flags() if getattr(args, f.name) is not None}
    if args.no_promotion and (args.alpha is not None or args.promotion_min_outcomes is not None):
        raise UserError("--no-promotion: not with --alpha or --promotion-min-outcomes")
    value = kind.from_flags(given, {"no_guardrail": args.no_guardrail, "min_outcomes": args.min_outcomes,
                                    "max_log_loss_increase": args.max_log_loss_increase,
                                    "no_promotion": args.no_promotion, "alpha": args.alpha,
                                    "promotion_min_outcomes": args.promotion_min_outcomes})
    try:
        return parse_model(args.model, value)
    except PolicyError as exc:
        field = str(exc).split(":", 1)[0]
        flag = "promotion-min-outcomes" if field.endswith("promotion.min_outcomes") else \
            field.rsplit(".", 1)[-1].replace("_", "-")
        raise UserError(f"--{flag}: {str(exc).split(': ', 1)[-1]}") from None


def _status(args: argparse.Namespace, policy: RolloutPolicyFile) -> int:
    print(f"policy file {args.file}{'' if args.file.exists() else ' (absent: latest for every model)'}")
    for name, rollout in sorted(policy.models.items()):
        print(f"  {name}: {json.dumps(rollout.to_json())}")
    if args.gateway:
        url = args.gateway.rstrip("/") + "/v1/rollout"
        key = api_key(args)
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
        try:
            with urllib.request.urlopen(request, timeout=5, context=https_context(args)) as response:
                live = json.load(response)
        except urllib.error.HTTPError as exc:
            hint = " (an admin key: --api-key-file or $ROUTERKT_API_KEY)" if exc.code in (401, 403) else ""
            raise UserError(f"cannot read {url}: HTTP {exc.code} {exc.reason}{hint}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise UserError(f"cannot read {url}: {getattr(exc, 'reason', exc)}") from None
        print(f"gateway {args.gateway}: " + ("policy file refused: " + live["error"] if live.get("error")
                                             else "policy file in force"))
        for name, entry in sorted(live.get("models", {}).items()):
            print(f"  {name}: {json.dumps(entry)}")
        for name, test in sorted(live.get("sequential_tests", {}).items()):
            print(f"  sequential test {name}: {_reading(test)}")
        for key, quality in sorted(live.get("quality", {}).items()):
            loss = quality.get("mean_log_loss")
            auc = quality.get("online_auc")
            print(f"  outcomes {key}: {quality['outcomes']}, mean log loss "
                  f"{'-' if loss is None else f'{loss:.4f}'}, online AUC {'-' if auc is None else f'{auc:.4f}'}")
    return 0


def _reading(test: dict) -> str:
    """One line of a canary's sequential test from /v1/rollout."""
    n, gap = test["outcomes"], test["difference"]
    verdict = {"promote": "candidate better: promoted", "rollback": "candidate worse: rolled back"}.get(
        test["decision"], "no decision yet (the split stays)")
    return (f"candidate {test['candidate']} - baseline {test['baseline']} mean clipped log loss in "
            f"[{gap['lower']:+.4f}, {gap['upper']:+.4f}] at confidence {1 - test['alpha']:g}, outcomes "
            f"{n['candidate']} / {n['baseline']} (min {test['min_outcomes']}): {verdict}")
