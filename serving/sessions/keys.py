"""Learner ids as the store sees them: a keyed hash, never the raw id.

key = HMAC-SHA256(secret, learner_id) as 32 hex characters. Without the secret a key cannot be
tied back to a learner id (unlike a plain hash of a guessable id). Event ids are hashed the same
way under the learner's key, so the store holds no client-chosen strings either.

The secret comes from a file (`--store-secret-file`, created with 32 random bytes and mode 0600
when missing) or from the environment variable ROUTERKT_STORE_SECRET. Every gateway sharing a
store must use the same secret.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from routerkt.atomic import atomic_write_bytes
from routerkt.errors import UserError

SECRET_ENV = "ROUTERKT_STORE_SECRET"
MIN_SECRET_BYTES = 16


class LearnerKeys:
    """learner id -> store key, and (learner key, event id) -> event key."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise UserError(f"the store secret must have at least {MIN_SECRET_BYTES} bytes")
        self._secret = secret

    def learner(self, learner_id: str) -> str:
        return hmac.new(self._secret, b"learner\0" + learner_id.encode(), hashlib.sha256).hexdigest()[:32]

    def bucket(self, learner_id: str, salt: str) -> float:
        """A number in [0, 1) fixed per (learner, salt), independent across salts (canary routing)."""
        digest = hmac.new(self._secret, b"bucket\0" + salt.encode() + b"\0" + learner_id.encode(), hashlib.sha256)
        return int.from_bytes(digest.digest()[:8], "big") / 2.0 ** 64

    def event(self, learner_key: str, event_id: str) -> str:
        message = b"event\0" + learner_key.encode() + b"\0" + event_id.encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()[:32]


def load_secret(path: Path | None, create: bool = True) -> bytes:
    """The secret from ROUTERKT_STORE_SECRET, else from `path` (created when missing and `create`)."""
    env = os.environ.get(SECRET_ENV)
    if env:
        return env.encode()
    if path is None:
        raise UserError(f"no store secret: set {SECRET_ENV} or give --store-secret-file")
    path = Path(path)
    if not path.exists():
        if not create:
            raise UserError(f"store secret file {path} does not exist")
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, secrets.token_hex(32).encode(), mode=0o600)
    try:
        secret = path.read_bytes().strip()
    except OSError as exc:
        raise UserError(f"cannot read the store secret file {path}: {exc.strerror}") from None
    if len(secret) < MIN_SECRET_BYTES:
        raise UserError(f"store secret file {path} holds fewer than {MIN_SECRET_BYTES} bytes")
    return secret
