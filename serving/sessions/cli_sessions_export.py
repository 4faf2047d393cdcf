"""`routerkt sessions export`: stream a session store's events to the canonical CSV, learner by learner,
in bounded memory."""
from __future__ import annotations

import argparse
import asyncio
import gzip
import io
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from routerkt.errors import UserError
from routerkt.flag_groups import add_store_credentials
from routerkt.timestamps import parse_time
from serving.sessions.factory import open_store
from serving.sessions.store import NO_TIMESTAMP, SessionStore, StoredEvent, StoreUnavailable

HEADER = "user_id,order,question_id,skill_id,correct,timestamp_ms\n"
CHUNK_LEARNERS = 256
USER_ID_HEX = 15          # user_id = the first 15 hex digits of the learner's keyed hash (< 2**60, >= 0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True,
                        help="sqlite:///PATH, redis://HOST:PORT/DB or rediss://USER@HOST:PORT/DB")
    parser.add_argument("--out", type=Path, required=True,
                        help="CSV to write (.gz: gzip); written atomically, mode 0600")
    parser.add_argument("--since", default=None, metavar="T",
                        help="only events with timestamp_ms >= T (ms since the epoch, or ISO 8601; UTC when no zone)")
    parser.add_argument("--until", default=None, metavar="T", help="only events with timestamp_ms < T")
    parser.add_argument("--chunk-learners", type=int, default=CHUNK_LEARNERS,
                        help=f"learners read per store call (memory: one chunk; default {CHUNK_LEARNERS})")
    add_store_credentials(parser)


def user_id(learner_key: str) -> int:
    """The CSV's integer user_id of a learner key: stable, never the platform's raw id."""
    return int(learner_key[:USER_ID_HEX], 16)


@dataclass
class ExportStats:
    out: str
    store: str
    learners: int = 0
    events: int = 0
    untimed_left_out: int = 0     # events without a timestamp, left out because --since/--until was given
    chunks: int = 0
    max_chunk_events: int = 0     # the most events one chunk held (the memory bound)
    seconds: float = 0.0
    events_per_s: float = 0.0


def _rows(key: str, events: list[StoredEvent], since: int | None, until: int | None, stats: ExportStats) -> list[str]:
    uid, rows = user_id(key), []
    bounded = since is not None or until is not None
    for order, e in enumerate(events):
        if bounded and e.timestamp_ms == NO_TIMESTAMP:
            stats.untimed_left_out += 1
            continue
        if (since is not None and e.timestamp_ms < since) or (until is not None and e.timestamp_ms >= until):
            continue
        skills = ";".join(map(str, e.skills)) if e.skills else "-1"
        rows.append(f"{uid},{order},{e.question_id},{skills},{e.correct},{e.timestamp_ms}\n")
    return rows


async def export_events(store: SessionStore, handle: io.TextIOBase, since: int | None = None, until: int | None = None,
                        chunk_learners: int = CHUNK_LEARNERS, stats: ExportStats | None = None) -> ExportStats:
    """Write every learner's events (oldest first) to `handle`, one chunk of learners at a time."""
    stats = stats or ExportStats(out="", store=store.kind)
    handle.write(HEADER)
    async for chunk in store.stream(chunk_learners):
        stats.chunks += 1
        stats.max_chunk_events = max(stats.max_chunk_events, sum(len(events) for _, events in chunk))
        for key, events in chunk:
            rows = _rows(key, events, since, until, stats)
            if rows:
                stats.learners += 1
                stats.events += len(rows)
                handle.writelines(rows)
    return stats


class _TempCsv:
    """A CSV written next to its target (mode 0600), fsynced and renamed over it on `commit`."""

    def __init__(self, out: Path) -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
        self.out, self.tmp, self.raw = out, Path(name), os.fdopen(fd, "wb")
        self.zipped = gzip.GzipFile(fileobj=self.raw, mode="wb", mtime=0) if out.name.endswith(".gz") else None
        self.text = io.TextIOWrapper(self.zipped or self.raw, encoding="utf-8", newline="")

    def commit(self) -> None:
        self.text.flush()
        if self.zipped is not None:
            self.zipped.close()
        self.raw.flush()
        os.fsync(self.raw.fileno())
        self.raw.close()
        os.replace(self.tmp, self.out)

    def discard(self) -> None:
        for handle in (self.zipped, self.raw):
            try:
                if handle is not None:
                    handle.close()
            except OSError:
                pass
        self.tmp.unlink(missing_ok=True)


def export_to_file(url: str, out: Path, since: int | None = None, until: int | None = None,
                   chunk_learners: int = CHUNK_LEARNERS, password_file: Path | None = None,
                   ca_file: Path | None = None) -> ExportStats:
    """Export the store at `url` to `out` atomically (the old file or the complete new one, never half)."""
    if chunk_learners < 1:
        raise UserError(f"--chunk-learners must be >= 1, got {chunk_learners}")
    if since is not None and until is not None and until <= since:
        raise UserError("--until must be after --since")
    store = open_store(url, password_file=password_file, ca_file=ca_file)
    if store.path is not None and not store.path.is_file():
        raise UserError(f"the store {store.kind} is not available: no store file {store.path}")
    try:
        target = _TempCsv(Path(out))
    except OSError as exc:
        raise UserError(f"--out {out}: cannot write ({exc.strerror})") from None
    stats = ExportStats(out=str(out), store=store.kind)
    started = time.perf_counter()

    async def main() -> None:
        await store.open()
        try:
            await store.ping()
            await export_events(store, target.text, since, until, chunk_learners, stats)
        finally:
            await store.close()
    try:
        try:
            asyncio.run(main())
            target.commit()
        finally:
            target.discard()
    except StoreUnavailable as exc:
        raise UserError(f"the store {store.kind} is not available: {str(exc)[:200]}") from None
    except OSError as exc:
        raise UserError(f"--out {out}: cannot write ({exc.strerror})") from None
    stats.seconds = round(time.perf_counter() - started, 3)
    stats.events_per_s = round(stats.events / max(stats.seconds, 1e-9), 1)
    return stats


def run(args: argparse.Namespace) -> int:
    stats = export_to_file(args.store, args.out, parse_time(args.since, "--since"), parse_time(args.until, "--until"),
                           args.chunk_learners, args.store_password_file, args.store_ca_file)
    print(json.dumps(asdict(stats)))
    return 0
