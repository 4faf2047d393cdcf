"""Flag groups several `routerkt` commands share (store credentials, a gateway client's key and CA), declared once."""
from __future__ import annotations

import argparse
from pathlib import Path

API_KEY_ENV = "ROUTERKT_API_KEY"                 # the environment variable a client's API key may come from
DEFAULT_ADMIN_KEY = Path(".routerkt/admin.key")  # the key `routerkt serve` makes (serving/security/default_keys.py)
GIVEN = "given_flags"                            # Namespace attribute: the dests of the flags on the command line


def given(args: argparse.Namespace) -> frozenset[str]:
    """The dests of the flags the command line gave (declared with the actions below), defaults aside."""
    return frozenset(getattr(args, GIVEN, ()))


def _mark(namespace: argparse.Namespace, dest: str) -> None:
    if getattr(namespace, GIVEN, None) is None:
        setattr(namespace, GIVEN, set())
    getattr(namespace, GIVEN).add(dest)


class Store(argparse.Action):
    """argparse's `store`, remembering that the flag was given (a file's value must yield to it)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        _mark(namespace, self.dest)


class Switch(argparse.BooleanOptionalAction):
    """--NAME / --no-NAME, remembering that one of them was given."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        super().__call__(parser, namespace, values, option_string)
        _mark(namespace, self.dest)


def add_store_credentials(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--store-password-file and --store-ca-file: how a command reaches a redis(s):// session store."""
    parser.add_argument("--store-password-file", type=Path, default=None, metavar="FILE", action=Store,
                        help="file holding the password of the --store redis(s)://USER@HOST:PORT/DB user "
                             "(never in the URL)")
    parser.add_argument("--store-ca-file", type=Path, default=None, metavar="PEM", action=Store,
                        help="CA that signed the store's certificate (rediss://)")


def add_client_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, ca_flag: str = "--tls-ca") -> None:
    """--api-key-file and the CA of the gateway's certificate (`ca_flag`: --tls-ca, or retrain's
    --gateway-ca-file beside its --store-ca-file): what a command calling the gateway sends and trusts."""
    parser.add_argument("--api-key-file", type=Path, default=None, metavar="FILE", action=Store,
                        help=f"file holding the API key to send (default: ${API_KEY_ENV} when set, else "
                             f"{DEFAULT_ADMIN_KEY} when it exists: the admin key `routerkt serve` made)")
    parser.add_argument(ca_flag, type=Path, default=None, metavar="PEM", action=Store,
                        help="CA that signed the gateway's certificate (the gateway serves TLS: https://, gRPC over "
                             "TLS)")
