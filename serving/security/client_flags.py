"""The client side of the gateway's security for the `routerkt` commands that call it (predict,
rollout status): an API key (--api-key-file, the ROUTERKT_API_KEY environment variable, or the admin
key `routerkt serve` made in .routerkt/admin.key of the current folder; never a flag value, which
would land in shell history and process lists) and the CA of its TLS certificate."""
from __future__ import annotations

import argparse
import os
import ssl
from pathlib import Path

from routerkt.errors import UserError
from routerkt.flag_groups import API_KEY_ENV as ENV_KEY
from routerkt.flag_groups import add_client_flags  # noqa: F401  (declared once, for retrain too)
from serving.security.default_keys import default_token


def api_key(args: argparse.Namespace) -> str | None:
    """The key to send, or None."""
    return key_from(args.api_key_file)


def key_from(api_key_file: Path | None, flag: str = "--api-key-file") -> str | None:
    """The key in `api_key_file` when given, else $ROUTERKT_API_KEY, else the admin key `routerkt serve` made."""
    if api_key_file is not None:
        try:
            key = Path(api_key_file).read_text().strip()
        except OSError as exc:
            raise UserError(f"{flag} {api_key_file}: {exc.strerror}") from None
        if not key:
            raise UserError(f"{flag} {api_key_file}: the file is empty")
        return key
    return os.environ.get(ENV_KEY) or default_token()


def tls_ca(args: argparse.Namespace) -> bytes | None:
    """The CA certificate's PEM bytes, or None (plaintext)."""
    if args.tls_ca is None:
        return None
    try:
        return args.tls_ca.read_bytes()
    except OSError as exc:
        raise UserError(f"--tls-ca {args.tls_ca}: {exc.strerror}") from None


def https_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    """An SSL context trusting --tls-ca for https:// URLs (None: the system's defaults)."""
    return context_from(args.tls_ca)


def context_from(ca_file: Path | None, flag: str = "--tls-ca") -> ssl.SSLContext | None:
    """An SSL context trusting the CA in `ca_file` (None: no file, plaintext http://)."""
    if ca_file is None:
        return None
    try:
        return ssl.create_default_context(cadata=Path(ca_file).read_text())
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise UserError(f"{flag} {ca_file}: {getattr(exc, 'strerror', None) or exc}") from None
