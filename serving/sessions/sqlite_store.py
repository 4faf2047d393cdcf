"""The embedded session store: one SQLite file in WAL mode with synchronous=FULL, so a commit that
returned survives a crash of the process (and of the machine).

    learners(learner PK, next_seq, count, last_seen_ms)
    events(learner, seq, event_key, question, skill, correct, ts, skills)
                                              PK (learner, seq), UNIQUE (learner, event_key)

`skill` is the event's first skill (-2: none); `skills` holds the whole set as text ("3;17") only
when it has more than one skill (NULL otherwise), so a single-skill event is stored as before. A
file written before skill sets gets the `skills` column added on open; its rows read as sets of one.

and, in a file of its own beside it (`<name>.served<suffix>`, its own thread and connection, WAL with
synchronous=NORMAL: a cache, so no fsync, and its writes never wait behind or block an event append):

    served(owner, question, model, version, probability, expires_ms)  PK (owner, question, model, version)

One writer thread and one reader thread, each with its own connection (sqlite3 connections stay in
the thread that made them); the event loop never waits on a lock. One read runs on the event loop's thread: at
most INLINE_READ_ROWS events (a cached learner's freshness check, serving/sessions/history.py): it runs on the
event loop's own connection with no busy wait (a WAL reader takes no lock a writer holds), about the cost
of the thread hop it saves; should SQLite answer busy or fail, the reader thread reads it. An append is one
IMMEDIATE transaction: skip known event keys, insert the rest with consecutive sequence numbers, trim to
`keep`, update the learner row. Another process writing the same file waits on SQLite's lock
(busy timeout), so appends of one learner stay ordered.
"""
from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import AsyncIterator

from serving.core.revision import Revision, new_base
from serving.sessions.store import AppendResult, History, ServedEntry, StoredEvent, StoreUnavailable, parse_skills

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS learners (learner TEXT PRIMARY KEY, next_seq INTEGER NOT NULL, "
    "count INTEGER NOT NULL, last_seen_ms INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS events (learner TEXT NOT NULL, seq INTEGER NOT NULL, event_key TEXT NOT NULL, "
    "question INTEGER NOT NULL, skill INTEGER NOT NULL, correct INTEGER NOT NULL, ts INTEGER NOT NULL, "
    "skills TEXT, PRIMARY KEY (learner, seq)) WITHOUT ROWID",
    "CREATE UNIQUE INDEX IF NOT EXISTS events_by_key ON events (learner, event_key)",
    "CREATE INDEX IF NOT EXISTS learners_by_last_seen ON learners (last_seen_ms)",
)
SERVED_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS served (owner TEXT NOT NULL, question INTEGER NOT NULL, model TEXT NOT NULL, "
    "version INTEGER NOT NULL, probability REAL NOT NULL, expires_ms INTEGER NOT NULL, "
    "PRIMARY KEY (owner, question, model, version)) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS served_by_expiry ON served (expires_ms)",
)
BUSY_TIMEOUT_S = 5.0
INLINE_READ_ROWS = 8       # a history read of at most this many events runs on the event loop's thread


class SqliteStore:
    kind = "sqlite"

    def __init__(self, path: Path, ttl_s: float = 0.0) -> None:
        self._file = Path(path)
        self.ttl_s = ttl_s
        self._local = threading.local()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-writer")
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-reader")
        self._served = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-served")
        self.served_path = self.path.with_name(f"{self.path.stem}.served{self.path.suffix}")

    @property
    def path(self) -> Path:
        """The file of the events (served predictions: `served_path` beside it)."""
        return self._file

    # -- lifecycle -------------------------------------------------------------------------------
    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for path in (self.path, self.served_path):   # learners' histories: owner only (SQLite's -wal and
            os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))   # -shm files take the same mode)
            os.chmod(path, 0o600)
        await self._run(self._writer, self._create)
        await self._run(self._served, self._create_served)

    async def close(self) -> None:
        self._close_local()                        # the event loop thread's read connection
        for pool in (self._writer, self._reader, self._served):
            await asyncio.get_running_loop().run_in_executor(pool, self._close_local)
            pool.shutdown(wait=False)              # its queue is empty: never block the event loop

    def _thread_connection(self, name: str, path: Path, synchronous: str) -> sqlite3.Connection:
        """This thread's connection `name` to `path` (WAL), made on first use."""
        conn = getattr(self._local, name, None)
        if conn is None:
            conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={synchronous}")
            setattr(self._local, name, conn)
        return conn

    def _connection(self) -> sqlite3.Connection:
        return self._thread_connection("conn", self.path, "FULL")

    def _loop_connection(self) -> sqlite3.Connection:
        """The event loop thread's read connection: never waits on a lock (busy: sqlite3.OperationalError)."""
        conn = getattr(self._local, "loop", None)
        if conn is None:
            conn = self._local.loop = sqlite3.connect(self.path, timeout=0, isolation_level=None)
        return conn

    def _served_connection(self) -> sqlite3.Connection:
        return self._thread_connection("served", self.served_path, "NORMAL")

    def _create_served(self) -> None:
        conn = self._served_connection()
        for statement in SERVED_SCHEMA:
            conn.execute(statement)

    def _close_local(self) -> None:
        for name in ("conn", "served", "loop"):
            conn = getattr(self._local, name, None)
            if conn is not None:
                conn.close()
                setattr(self._local, name, None)

    def _create(self) -> None:
        conn = self._connection()
        for statement in SCHEMA:
            conn.execute(statement)
        if "skills" not in {row[1] for row in conn.execute("PRAGMA table_info(events)")}:   # a file from before sets
            try:
                conn.execute("ALTER TABLE events ADD COLUMN skills TEXT")
            except sqlite3.OperationalError as exc:               # another process added it just now
                if "duplicate column" not in str(exc):
                    raise

    async def _run(self, pool: ThreadPoolExecutor, fn, *args):
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"sqlite: {exc}") from None

    # -- operations ------------------------------------------------------------------------------
    async def ping(self) -> None:
        await self._run(self._reader, lambda: self._connection().execute("SELECT 1").fetchone())

    async def append(self, learner_key: str, events: list[StoredEvent], keep: int, now_ms: int) -> AppendResult:
        return (await self.append_many([(learner_key, events)], keep, now_ms))[0]

    async def append_many(self, batch: list[tuple[str, list[StoredEvent]]], keep: int,
                          now_ms: int) -> list[AppendResult]:
        """Several learners' appends in ONE transaction (bulk import)."""
        return await self._run(self._writer, self._append_many, batch, keep, now_ms)

    def _append_many(self, batch: list[tuple[str, list[StoredEvent]]], keep: int, now_ms: int) -> list[AppendResult]:
        conn = self._connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            results = [self._append(conn, learner, events, keep, now_ms) for learner, events in batch]
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return results

    def _append(self, conn: sqlite3.Connection, learner: str, events: list[StoredEvent], keep: int,
                now_ms: int) -> AppendResult:
        row = conn.execute("SELECT next_seq, count FROM learners WHERE learner = ?", (learner,)).fetchone()
        next_seq, count = row if row else (new_base(), 0)
        keys = [e.event_key for e in events]
        known: set[str] = set()
        for start in range(0, len(keys), 500):                  # SQLite's bound-parameter limit
            chunk = keys[start:start + 500]
            marks = ",".join("?" * len(chunk))
            known.update(k for (k,) in conn.execute(
                f"SELECT event_key FROM events WHERE learner = ? AND event_key IN ({marks})", (learner, *chunk)))
        flags = []
        for e in events:                                         # a key twice in one request: stored once
            flags.append(e.event_key not in known)
            known.add(e.event_key)
        new = [e for e, is_new in zip(events, flags) if is_new]
        conn.executemany(
            "INSERT INTO events (learner, seq, event_key, question, skill, correct, ts, skills) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(learner, next_seq + i, e.event_key, e.question_id, e.first_skill, e.correct, e.timestamp_ms,
              e.skill_text if len(e.skills) > 1 else None) for i, e in enumerate(new)])
        next_seq += len(new)
        conn.execute("DELETE FROM events WHERE learner = ? AND seq < ?", (learner, next_seq - keep))
        count = min(count + len(new), keep)
        conn.execute("INSERT INTO learners (learner, next_seq, count, last_seen_ms) VALUES (?, ?, ?, ?) "
                     "ON CONFLICT (learner) DO UPDATE SET next_seq = excluded.next_seq, count = excluded.count, "
                     "last_seen_ms = excluded.last_seen_ms", (learner, next_seq, count, now_ms))
        return AppendResult(stored=len(new), duplicates=len(events) - len(new), history_length=count,
                            new=tuple(flags), revision=Revision(next_seq - count, next_seq) if count else None)

    async def history(self, learner_key: str, limit: int) -> History:
        def read(conn: sqlite3.Connection) -> History:
            rows = conn.execute(                          # one statement: the events and the log, one snapshot
                "SELECT question, skill, correct, skills, (SELECT next_seq FROM learners WHERE learner = ?1), "
                "(SELECT count FROM learners WHERE learner = ?1) FROM events WHERE learner = ?1 "
                "ORDER BY seq DESC LIMIT ?2", (learner_key, limit)).fetchall()[::-1]
            sets = {i: parse_skills(row[3]) for i, row in enumerate(rows) if row[3] is not None}
            revision = Revision(rows[0][4] - rows[0][5], rows[0][4]) if rows and rows[0][4] is not None else None
            return History.from_rows([row[:3] for row in rows], sets, revision)
        if limit <= INLINE_READ_ROWS:
            try:
                return read(self._loop_connection())
            except sqlite3.Error:                         # busy, or failing: the reader thread, which waits or says
                pass
        return await self._run(self._reader, lambda: read(self._connection()))

    async def forget(self, learner_key: str) -> tuple[bool, int]:
        def delete() -> tuple[bool, int]:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                deleted = conn.execute("DELETE FROM events WHERE learner = ?", (learner_key,)).rowcount
                existed = conn.execute("DELETE FROM learners WHERE learner = ?", (learner_key,)).rowcount > 0
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return existed or deleted > 0, deleted
        result = await self._run(self._writer, delete)
        await self._run(self._served, lambda: self._served_connection().execute(
            "DELETE FROM served WHERE owner = ?", (learner_key,)))
        return result

    async def expire(self, now_ms: int) -> int:
        """Delete learners inactive for longer than the TTL; returns how many (0 without a TTL)."""
        if self.ttl_s <= 0:
            return 0

        def sweep() -> int:
            conn = self._connection()
            cutoff = now_ms - int(self.ttl_s * 1000)
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute("DELETE FROM events WHERE learner IN "
                             "(SELECT learner FROM learners WHERE last_seen_ms < ?)", (cutoff,))
                gone = conn.execute("DELETE FROM learners WHERE last_seen_ms < ?", (cutoff,)).rowcount
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return gone
        return await self._run(self._writer, sweep)

    async def learner_keys(self) -> list[str]:
        def keys() -> list[str]:
            conn = self._connection()
            rows = conn.execute("SELECT learner FROM learners UNION SELECT DISTINCT learner FROM events").fetchall()
            return sorted(k for (k,) in rows)
        return await self._run(self._reader, keys)

    async def stream(self, chunk_learners: int) -> AsyncIterator[list[tuple[str, list[StoredEvent]]]]:
        """Learners in key order, `chunk_learners` (<= 500) per read; each chunk one read transaction."""
        after = ""
        while True:
            chunk = await self._run(self._reader, self._read_chunk, after, max(1, min(chunk_learners, 500)))
            if not chunk:
                return
            after = chunk[-1][0]
            yield [(learner, events) for learner, events in chunk if events]

    def _read_chunk(self, after: str, n: int) -> list[tuple[str, list[StoredEvent]]]:
        conn = self._connection()
        conn.execute("BEGIN")
        try:
            keys = [k for (k,) in conn.execute("SELECT learner FROM learners WHERE learner > ? ORDER BY learner "
                                                "LIMIT ?", (after, n))]
            found: dict[str, list[StoredEvent]] = {k: [] for k in keys}
            if keys:
                rows = conn.execute(f"SELECT learner, question, skill, correct, ts, skills FROM events WHERE learner "
                                    f"IN ({','.join('?' * len(keys))}) ORDER BY learner, seq", keys)
                for learner, question, skill, correct, ts, skills in rows:
                    found[learner].append(StoredEvent("", question, parse_skills(skills) if skills else skill,
                                                      correct, ts))
        finally:
            conn.execute("COMMIT")
        return list(found.items())

    # -- served predictions (outcome tracking) -----------------------------------------------------
    def _served_transaction(self, work):
        conn = self._served_connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = work(conn)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return result

    async def remember_served(self, entries: list[ServedEntry], expires_ms: int) -> None:
        rows = [(e.owner, e.question_id, e.model, e.version, e.probability, expires_ms) for e in entries]
        await self._run(self._served, self._served_transaction, lambda conn: conn.executemany(
            "INSERT OR REPLACE INTO served (owner, question, model, version, probability, expires_ms) "
            "VALUES (?, ?, ?, ?, ?, ?)", rows))

    async def take_served(self, owner: str, questions: list[int], now_ms: int) -> list[ServedEntry]:
        questions = sorted(set(questions))

        def take(conn: sqlite3.Connection) -> list[ServedEntry]:
            rows = []
            for start in range(0, len(questions), 500):          # SQLite's bound-parameter limit
                chunk = questions[start:start + 500]
                marks = ",".join("?" * len(chunk))
                rows += conn.execute(f"DELETE FROM served WHERE owner = ? AND question IN ({marks}) "
                                     "RETURNING question, model, version, probability, expires_ms",
                                     (owner, *chunk)).fetchall()
            return [ServedEntry(owner, q, m, v, p) for q, m, v, p, expires in rows if expires > now_ms]
        if not questions:
            return []
        return await self._run(self._served, self._served_transaction, take)

    async def sweep_served(self, now_ms: int) -> int:
        """Delete expired served entries; returns how many."""
        return await self._run(self._served, self._served_transaction, lambda conn: conn.execute(
            "DELETE FROM served WHERE expires_ms <= ?", (now_ms,)).rowcount)
