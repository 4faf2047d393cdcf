"""`routerkt keys`: issue, list and revoke the gateway's API keys (the file `routerkt serve --api-keys` reads).

    routerkt keys issue  --file keys.jsonl --id ops-1 --scope predict --scope observe
    routerkt keys list   --file keys.jsonl
    routerkt keys revoke --file keys.jsonl --id ops-1

`issue` prints the key (`<id>.<secret>`) once, on stdout; the file keeps only sha256(secret), its
scopes and when it was made (mode 0600). A running gateway picks up changes within a second.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from serving.security.api_keys import issue_key, parse_keys, revoke_key
from serving.security.scopes import SCOPES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, parser_class=type(parser))
    issue = sub.add_parser("issue", help="add a key and print it once")
    issue.add_argument("--id", required=True, help="key id: names the caller in the audit log ([a-z0-9_-])")
    issue.add_argument("--scope", action="append", choices=SCOPES, required=True,
                       help="a scope the key grants (repeat for several)")
    sub.add_parser("list", help="key ids and scopes (no secrets: the file holds none)")
    revoke = sub.add_parser("revoke", help="remove a key")
    revoke.add_argument("--id", required=True)
    for action in sub.choices.values():
        action.add_argument("--file", type=Path, required=True, help="the API keys file")


def run(args: argparse.Namespace) -> int:
    if args.action == "issue":
        token = issue_key(args.file, args.id, args.scope)
        print(token)
    elif args.action == "revoke":
        revoke_key(args.file, args.id)
        print(f"{args.file}: key {args.id} revoked")
    else:
        text = args.file.read_text(encoding="utf-8") if args.file.exists() else ""
        for key in parse_keys(text, str(args.file)).values():
            print(f"{key.key_id}: {', '.join(sorted(key.scopes))}")
    return 0
