"""`routerkt sessions import`: bulk-load a canonical interactions CSV (a platform's backlog) into a
session store, as if every answer had been Observed in order.

    routerkt sessions import --data interactions.csv[.gz] --store sqlite:///PATH | redis://HOST:PORT/DB
                             [--keep 1000] [--secret-file FILE]

Columns `user_id,order,question_id,skill_id,correct` (-1 = unknown skill; a skill set as `3;17`,
the canonical CSV's form, is stored as the event's set). Each learner's rows are
sorted by `order`; the learner id is the CSV's user_id as text; event ids are `import-<order>`,
so importing the same file again stores nothing twice. Only the newest `keep` events of a learner
are sent (the store would trim older ones anyway). Learners go to the store in chunks
(SQLite: one transaction per chunk; Redis: one pipeline of atomic appends per chunk). Prints
learners, events and events/s. A malformed file stops with one line naming the line, exit code 2,
before anything is written.
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import gzip
import io
import time
from pathlib import Path

from routerkt.errors import UserError
from routerkt.flag_groups import add_store_credentials
from serving.sessions.keys import LearnerKeys, load_secret
from serving.sessions.factory import open_store
from serving.sessions.store import StoredEvent

COLUMNS = ("user_id", "order", "question_id", "skill_id", "correct")
CHUNK_LEARNERS = 256


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, required=True, help="canonical interactions CSV (plain or .gz)")
    parser.add_argument("--store", required=True,
                        help="sqlite:///PATH, redis://HOST:PORT/DB or rediss://USER@HOST:PORT/DB")
    parser.add_argument("--keep", type=int, default=1000, help="events kept per learner (the gateway's --store-keep)")
    parser.add_argument("--secret-file", type=Path, default=Path(".routerkt/store.secret"),
                        help="HMAC secret for learner keys, the gateway's (ROUTERKT_STORE_SECRET wins)")
    add_store_credentials(parser)


def read_learners(path: Path) -> dict[str, list[tuple[int, tuple[int, ...], int, int]]]:
    """user id -> [(order, question, skill, correct)] sorted by order; UserError naming the line."""
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    opener = gzip.open if path.suffix == ".gz" else open
    learners: dict[str, list[tuple[int, tuple[int, ...], int, int]]] = {}
    try:
        with opener(path, "rb") as raw:
            reader = csv.reader(io.TextIOWrapper(raw, encoding="utf-8", newline=""))
            header = next(reader, None)
            if header is None or tuple(h.strip().lower() for h in header) != COLUMNS:
                raise UserError(f"{path}:1: expected the header {','.join(COLUMNS)}, got {header!r}")
            for line, row in enumerate(reader, start=2):
                if len(row) != 5:
                    raise UserError(f"{path}:{line}: expected 5 columns, got {len(row)}")
                try:
                    order, question, correct = int(row[1]), int(row[2]), int(row[4])
                    skills = tuple(int(s) for s in row[3].split(";"))
                except ValueError:
                    raise UserError(f"{path}:{line}: order, question_id, skill_id (or ids a;b) and correct must be "
                                    f"integers") from None
                if correct not in (0, 1) or question < 0 or min(skills) < -1 or not row[0].strip():
                    raise UserError(f"{path}:{line}: needs a user_id, question_id >= 0, skill_id >= -1, correct 0/1")
                learners.setdefault(row[0].strip(), []).append((order, question, skills, correct))
    except (OSError, EOFError, UnicodeDecodeError, csv.Error) as exc:
        raise UserError(f"{path}: cannot read ({exc})") from None
    for rows in learners.values():
        rows.sort(key=lambda r: r[0])
    return learners


async def import_learners(learners: dict[str, list[tuple[int, tuple[int, ...], int, int]]], store, keys: LearnerKeys,
                          keep: int) -> tuple[int, int]:
    """(events stored, duplicates) after appending every learner's newest `keep` events."""
    stored = duplicates = 0
    now_ms = int(time.time() * 1000)
    items = list(learners.items())
    for start in range(0, len(items), CHUNK_LEARNERS):
        batch = []
        for user, rows in items[start:start + CHUNK_LEARNERS]:
            key = keys.learner(user)
            batch.append((key, [StoredEvent(keys.event(key, f"import-{o}"), q, s, c) for o, q, s, c in rows[-keep:]]))
        for result in await store.append_many(batch, keep, now_ms):
            stored += result.stored
            duplicates += result.duplicates
    return stored, duplicates


def run(args: argparse.Namespace) -> int:
    if args.keep < 1:
        raise UserError(f"--keep must be >= 1, got {args.keep}")
    store = open_store(args.store, password_file=args.store_password_file, ca_file=args.store_ca_file)
    keys = LearnerKeys(load_secret(args.secret_file))
    started = time.perf_counter()
    learners = read_learners(args.data)
    read_s = time.perf_counter() - started

    async def main() -> tuple[int, int]:
        await store.open()
        try:
            await store.ping()
            return await import_learners(learners, store, keys, args.keep)
        finally:
            await store.close()
    from serving.sessions.store import StoreUnavailable
    begun = time.perf_counter()
    try:
        stored, duplicates = asyncio.run(main())
    except StoreUnavailable as exc:
        raise UserError(f"the store {store.kind} is not available: {str(exc)[:200]}") from None
    write_s = time.perf_counter() - begun
    events = stored + duplicates
    print(f"imported {len(learners)} learners: {stored} events stored, {duplicates} already there; "
          f"read {read_s:.1f}s, store {write_s:.1f}s = {events / max(write_s, 1e-9):,.0f} events/s ({store.kind})")
    return 0
