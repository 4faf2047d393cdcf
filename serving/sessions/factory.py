"""`open_store(url)`: the session store a URL names, one opener per scheme (a new store is one file
plus one entry in OPENERS).

URLs: `sqlite:///relative/path.sqlite3`, `sqlite:////absolute/path.sqlite3`, `redis://HOST:PORT/DB`,
`rediss://USER@HOST:PORT/DB` (TLS; the user's password from a file, never in the URL).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable
from urllib.parse import ParseResult, urlparse

from routerkt.errors import UserError
from serving.sessions.store import SessionStore


def _sqlite(url: str, parsed: ParseResult, ttl_s: float, password_file: Path | None = None,
            ca_file: Path | None = None) -> SessionStore:
    path = url[len("sqlite:///"):] if url.startswith("sqlite:///") else ""
    if not path:
        raise UserError(f"--store {url!r}: expected sqlite:///PATH")
    from serving.sessions.sqlite_store import SqliteStore
    return SqliteStore(Path(path), ttl_s=ttl_s)


def _redis(url: str, parsed: ParseResult, ttl_s: float, password_file: Path | None = None,
           ca_file: Path | None = None) -> SessionStore:
    shown = f"{parsed.scheme}://{parsed.hostname}:{parsed.port}{parsed.path}"    # never a password
    if parsed.password is not None:
        raise UserError(f"--store {shown}: put the password in --store-password-file, not in the URL")
    if not parsed.hostname or not parsed.port:
        raise UserError(f"--store {shown}: expected {parsed.scheme}://[USER@]HOST:PORT/DB")
    db = parsed.path.lstrip("/") or "0"
    if not db.isdigit():
        raise UserError(f"--store {shown}: the database must be a number")
    password = None
    if password_file is not None:
        try:
            password = Path(password_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else None
            raise UserError(f"--store-password-file {password_file}: cannot read it "
                            f"({reason or type(exc).__name__})") from None
    from serving.sessions.redis_store import RedisStore
    return RedisStore(parsed.hostname, parsed.port, int(db), ttl_s=ttl_s, username=parsed.username,
                      password=password, tls=parsed.scheme == "rediss", ca_file=ca_file)


# scheme -> opener; implementations are imported only when their scheme is used
OPENERS: dict[str, Callable[..., SessionStore]] = {"sqlite": _sqlite, "redis": _redis, "rediss": _redis}


def open_store(url: str, ttl_s: float = 0.0, password_file: Path | None = None,
               ca_file: Path | None = None) -> SessionStore:
    """The store a URL names (not yet opened); UserError for an unsupported or malformed URL.
    `password_file` / `ca_file`: the Redis user's password and the CA of its TLS certificate."""
    parsed = urlparse(url)
    opener = OPENERS.get(parsed.scheme)
    if opener is None:
        raise UserError(f"--store {parsed.scheme}://...: use sqlite:///PATH, redis://HOST:PORT/DB or "
                        f"rediss://USER@HOST:PORT/DB")
    return opener(url, parsed, ttl_s, password_file, ca_file)
