"""Keys on by default: `routerkt serve` on loopback without --api-keys makes its own admin key.

The state folder is made private (mode 0700: the SQLite store, the store secret, the keys and
Triton's key inside are this user's alone). It holds `keys.jsonl` (hashes, as `routerkt keys`
writes them) and `admin.key` (mode 0600): one key with every scope, which the `routerkt` commands
run from the same folder pick up (serving/security/client_flags.py) and the sample of `make serve`
sends. Another local user reaches the loopback ports but holds no key, so it reads nothing and
changes nothing (docs/security.md). `--insecure` serves without keys (one user per host).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from routerkt.atomic import atomic_path
from routerkt.errors import UserError
from serving.security.api_keys import issue_key, parse_keys, revoke_key
from serving.security.scopes import SCOPES

log = logging.getLogger("routerkt.security")
DEFAULT_STATE_DIR = Path(".routerkt")
KEYS_FILE, TOKEN_FILE, ADMIN_ID = "keys.jsonl", "admin.key", "serve-admin"


def private_dir(path: Path) -> Path:
    """`path` made (parents too) and set to mode 0700 (a warning where it cannot be); UserError when it
    cannot be made."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise UserError(f"--state-dir {path}: {exc.strerror}") from None
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        try:
            os.chmod(path, 0o700)
            log.info("state folder %s set to mode 0700 (it holds learner data and keys)", path)
        except OSError:                                # a mount this user does not own: said, not fatal
            log.warning("state folder %s is mode %o and cannot be made 0700: other users of the host may read "
                        "the learner data and keys in it", path, mode)
    return path


def default_keys(state_dir: Path) -> Path:
    """The keys file of a loopback gateway without --api-keys: <state_dir>/keys.jsonl, with an admin
    key whose token is in <state_dir>/admin.key (both 0600), made when either is missing."""
    state_dir = private_dir(state_dir)
    keys, token = state_dir / KEYS_FILE, state_dir / TOKEN_FILE
    text = keys.read_text(encoding="utf-8") if keys.exists() else ""
    known = parse_keys(text, str(keys))
    if token.exists() and ADMIN_ID in known:
        return keys
    if ADMIN_ID in known:
        revoke_key(keys, ADMIN_ID)                     # its token is lost: a new one
    secret = issue_key(keys, ADMIN_ID, list(SCOPES))
    with atomic_path(token, mode=0o600) as tmp:
        tmp.write_text(secret + "\n", encoding="utf-8")
    log.info("API keys: %s, with an admin key for this user's `routerkt` commands in %s (mode 0600)", keys, token)
    return keys


def default_token(state_dir: Path = DEFAULT_STATE_DIR) -> str | None:
    """The admin key `default_keys` wrote under `state_dir`, or None (missing or unreadable)."""
    try:
        return (Path(state_dir) / TOKEN_FILE).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None
