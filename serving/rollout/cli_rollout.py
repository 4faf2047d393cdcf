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
import urllib.error
import urllib.request
from pathlib import Path

from routerkt.errors import UserError
from routerkt.urls import gateway_url
from serving.security.client_flags import add_client_flags, api_key, https_context
from serving.rollout.kinds import KINDS
from serving.rollout.kinds.base import Rollout
from serving.rollout.kinds.pinned import Pinned
from serving.rollout.policy_file import PolicyError, RolloutPolicyFile, parse_model, read_policy, write_policy

DEFAULT_FILE = Path(".routerkt") / "rollout.json"
DERIVED = ("since_canary_began", "routing")        # what a gateway adds to an entry in GET /v1/rollout


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
    source = _Gateway(args) if args.gateway else _File(args.file or DEFAULT_FILE)
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


def describe(rollout: Rollout) -> dict[str, object]:
    """A model's entry and what follows from it, for --json: the versions it names and the one most learners get."""
    split = rollout.split()
    return {"entry": rollout.to_json(), "versions": sorted(rollout.versions()), "served": rollout.served(),
            "split": None if split is None else {"baseline": split.baseline, "candidate": split.candidate}}


class _File:
    """The policy file, read and written here."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = f"policy file {path}"

    def read(self) -> RolloutPolicyFile:
        try:
            return read_policy(self.path)
        except PolicyError as exc:
            raise UserError(f"{self.path} is malformed ({exc}); fix or remove it first") from None

    def rollout(self, model: str) -> Rollout:
        return self.read().get(model)

    def change(self, model: str, rollout: Rollout) -> dict[str, object]:
        policy = self.read()
        write_policy(self.path, RolloutPolicyFile({**policy.models, model: rollout}))
        return rollout.to_json()

    def status(self) -> dict[str, object]:
        policy = self.read()
        return {"source": self.name, "file": str(self.path), "exists": self.path.exists(), "error": None,
                "models": {name: describe(r) for name, r in sorted(policy.models.items())}}



class _Gateway:
    """A gateway's rollout API: GET /v1/rollout, PUT /v1/rollout/MODEL."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.key, self.context = api_key(args), https_context(args)
        self.base = gateway_url(args.gateway, tls=self.context is not None)
        self.name = f"gateway {args.gateway}"

    def _call(self, method: str, path: str, body: object = None) -> dict:
        url = self.base + path
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        data = None
        if body is not None:
            data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=120, context=self.context) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            hint = " (an admin key: --api-key-file or $ROUTERKT_API_KEY)" if exc.code in (401, 403) else ""
            try:
                message = json.loads(exc.read() or b"{}").get("error", {}).get("message", "")
            except ValueError:
                message = ""
            raise UserError(f"{method} {url}: HTTP {exc.code} {message or exc.reason}{hint}") from None
        except urllib.error.URLError as exc:
            raise UserError(f"cannot reach {url}: {exc.reason}") from None
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot reach {url}: {exc}") from None

    def status(self) -> dict[str, object]:
        live = self._call("GET", "/v1/rollout")
        models = {}
        for name, entry in sorted(live.get("models", {}).items()):
            rollout = parse_model(name, {k: v for k, v in entry.items() if k not in DERIVED})
            models[name] = {**describe(rollout), **{k: entry[k] for k in DERIVED if k in entry}}
        return {"source": self.name, "file": live.get("file"), "error": live.get("error"), "models": models,
                "sequential_tests": live.get("sequential_tests", {}), "quality": live.get("quality", {})}

    def rollout(self, model: str) -> Rollout:
        entry = self.status()["models"].get(model)
        return parse_model(model, entry["entry"]) if entry else RolloutPolicyFile().get(model)

    def change(self, model: str, rollout: Rollout) -> dict[str, object]:
        return self._call("PUT", f"/v1/rollout/{model}", rollout.to_json())["policy"]


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
    if args.note:
        value["note"] = args.note
    try:
        return parse_model(args.model, value)
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
        views.append(_File(args.file or DEFAULT_FILE).status())
    if args.gateway:
        views.append(_Gateway(args).status())
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
