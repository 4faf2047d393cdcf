"""`open_store(url)`: the session store a URL names, one opener per scheme (a new store is one file
plus one entry in OPENERS).

URLs: `sqlite:///relative/path.sqlite3`, `sqlite:////absolute/path.sqlite3`, `redis://HOST:PORT/DB`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable
from urllib.parse import ParseResult, urlparse

from routerkt.errors import UserError
from serving.sessions.store import SessionStore


def _sqlite(url: str, parsed: ParseResult, ttl_s: float) -> SessionStore:
    path = url[len("sqlite:///"):] if url.startswith("sqlite:///") else ""
    if not path:
        raise UserError(f"--store {url!r}: expected sqlite:///PATH")
    from serving.sessions.sqlite_store import SqliteStore
    return SqliteStore(Path(path), ttl_s=ttl_s)


def _redis(url: str, parsed: ParseResult, ttl_s: float) -> SessionStore:
    if not parsed.hostname or not parsed.port:
        raise UserError(f"--store {url!r}: expected redis://HOST:PORT/DB")
    db = parsed.path.lstrip("/") or "0"
    if not db.isdigit():
        raise UserError(f"--store {url!r}: the database must be a number")
    from serving.sessions.redis_store import RedisStore
    return RedisStore(parsed.hostname, parsed.port, int(db), ttl_s=ttl_s)


# scheme -> opener; implementations are imported only when their scheme is used
OPENERS: dict[str, Callable[[str, ParseResult, float], SessionStore]] = {"sqlite": _sqlite, "redis": _redis}


def open_store(url: str, ttl_s: float = 0.0) -> SessionStore:
    """The store a URL names (not yet opened); UserError for an unsupported or malformed URL."""
    parsed = urlparse(url)
    opener = OPENERS.get(parsed.scheme)
    if opener is None:
        raise UserError(f"--store {url!r}: use sqlite:///PATH or redis://HOST:PORT/DB")
    return opener(url, parsed, ttl_s)
