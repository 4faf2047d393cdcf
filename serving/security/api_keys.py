"""The API keys file: one JSON object per line, {"id", "sha256", "scopes", "created"}; only hashes.

A key as callers send it is `<id>.<secret>` (header `authorization: Bearer <id>.<secret>`); the file
holds sha256(secret) in hex. The secret is 32 random bytes (token_urlsafe), so a fast hash is as
safe as a slow one here (nothing to guess) and keeps the check at about a microsecond per call
(docs/security.md says why keys and not signed tokens). The file is re-read when it changes
(checked at most every RELOAD_CHECK_S); a file that no longer parses keeps the keys in force and
is logged once.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from routerkt.atomic import atomic_path
from routerkt.errors import UserError
from serving.security.scopes import SCOPES

log = logging.getLogger("routerkt.security")

RELOAD_CHECK_S = 1.0
KEY_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
_DUMMY = hashlib.sha256(b"").hexdigest()


@dataclass(frozen=True)
class ApiKey:
    key_id: str
    sha256: str
    scopes: frozenset[str]


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def parse_keys(text: str, where: str) -> dict[str, ApiKey]:
    """key id -> ApiKey; UserError naming the line for anything malformed."""
    keys: dict[str, ApiKey] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            key_id, hashed, scopes = entry["id"], entry["sha256"], entry["scopes"]
        except (ValueError, KeyError, TypeError):
            raise UserError(f"{where} line {number}: expected {{\"id\", \"sha256\", \"scopes\"}}") from None
        if not isinstance(key_id, str) or not KEY_ID.fullmatch(key_id) or key_id in keys:
            raise UserError(f"{where} line {number}: id must be unique, [a-z0-9_-], at most 32 characters")
        if not isinstance(hashed, str) or not re.fullmatch(r"[0-9a-f]{64}", hashed):
            raise UserError(f"{where} line {number}: sha256 must be 64 hex digits")
        if not isinstance(scopes, list) or not set(scopes) <= set(SCOPES):
            raise UserError(f"{where} line {number}: scopes must be a list of {list(SCOPES)}")
        keys[key_id] = ApiKey(key_id, hashed, frozenset(scopes))
    return keys


class KeyFile:
    """The keys in force, from `path`, re-read when the file changes."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._stamp = self._stat()
        if self._stamp is None:
            raise UserError(f"--api-keys {self.path}: no such file (create it with `routerkt keys issue`)")
        self._keys = parse_keys(self.path.read_text(encoding="utf-8"), f"--api-keys {self.path}")
        self._checked = time.monotonic()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now - self._checked < RELOAD_CHECK_S:
            return
        self._checked = now
        stamp = self._stat()
        if stamp is None or stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            self._keys = parse_keys(self.path.read_text(encoding="utf-8"), str(self.path))
            log.info("API keys reloaded: %d keys", len(self._keys))
        except (UserError, OSError, UnicodeDecodeError) as exc:
            log.error("API keys file changed but was refused (the previous keys stay in force): %s", exc)

    def lookup(self, token: str) -> ApiKey | None:
        """The key `token` (`<id>.<secret>`) proves, or None; the same work for an unknown id."""
        self._maybe_reload()
        key_id, _, secret = token.partition(".")
        key = self._keys.get(key_id)
        ok = hmac.compare_digest(digest(secret), key.sha256 if key is not None else _DUMMY)
        return key if ok and key is not None and secret else None

    def known(self, key_id: str) -> bool:
        """Whether `key_id` names a key in force (for the log of a failure; never told to callers)."""
        return key_id in self._keys

    def __len__(self) -> int:
        return len(self._keys)


def issue_key(path: Path, key_id: str, scopes: list[str]) -> str:
    """Add a key to the file (created 0600 when missing); returns the token, which is stored nowhere."""
    if not KEY_ID.fullmatch(key_id):
        raise UserError(f"key id {key_id[:40]!r}: use [a-z0-9_-], at most 32 characters, "
                        "starting with a letter or digit")
    unknown = set(scopes) - set(SCOPES)
    if not scopes or unknown:
        raise UserError(f"--scope: choose from {list(SCOPES)}")
    path = Path(path)
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if key_id in parse_keys(text, str(path)):
        raise UserError(f"key id {key_id} exists in {path}; revoke it first or choose another id")
    secret = secrets.token_urlsafe(32)
    entry = {"id": key_id, "sha256": digest(secret), "scopes": sorted(set(scopes)),
             "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    write_keys_text(path, text + ("" if not text or text.endswith("\n") else "\n") + json.dumps(entry) + "\n")
    return f"{key_id}.{secret}"


def revoke_key(path: Path, key_id: str) -> None:
    path = Path(path)
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if key_id not in parse_keys(text, str(path)):
        raise UserError(f"no key {key_id[:40]!r} in {path}")
    kept = [line for line in text.splitlines() if line.strip() and json.loads(line)["id"] != key_id]
    write_keys_text(path, "".join(line + "\n" for line in kept))


def write_keys_text(path: Path, text: str) -> None:
    with atomic_path(path, mode=0o600) as tmp:
        tmp.write_text(text, encoding="utf-8")
