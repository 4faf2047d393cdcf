"""Event times on the command line: milliseconds since the epoch, or ISO 8601 (UTC when no zone is named)."""
from __future__ import annotations

from datetime import datetime, timezone

from routerkt.errors import UserError


def parse_time(text: str | None, flag: str) -> int | None:
    """Milliseconds since the epoch from an integer or an ISO 8601 time; None for None."""
    if text is None:
        return None
    if text.strip().lstrip("-").isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UserError(f"{flag} {text!r}: expected milliseconds since the epoch or an ISO 8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


def format_time(ms: int) -> str:
    """Milliseconds since the epoch as a plain UTC time: 2026-12-03 12:00:00 UTC."""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
