"""The two session stores against one contract, each the real thing: SQLite (a file, WAL) and a
redis-server process on loopback. Appends are ordered and idempotent, retention and forget hold,
and learner keys are keyed hashes."""
from __future__ import annotations

import asyncio
import sqlite3
import time

import pytest

from serving.sessions.keys import LearnerKeys
from serving.sessions.redis_server import RedisServer
from serving.sessions.factory import open_store
from serving.sessions.store import StoredEvent, StoreUnavailable

pytestmark = pytest.mark.integration

KEYS = LearnerKeys(b"test-secret-of-32-bytes-for-hmac!")


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request, tmp_path, redis_server):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sessions.sqlite3'}"
    return redis_server.url.replace("/0", f"/{hash(tmp_path) % 15 + 1}")   # a fresh database per test


def events(learner: str, ids, start_q: int = 100) -> list[StoredEvent]:
    key = KEYS.learner(learner)
    return [StoredEvent(KEYS.event(key, str(i)), start_q + n, 7, n % 2, 1000 + n) for n, i in enumerate(ids)]


def run(coro):
    return asyncio.run(coro)


async def with_store(url, fn, ttl_s: float = 0.0):
    store = open_store(url, ttl_s=ttl_s)
    await store.open()
    try:
        if store.kind == "redis":
            await store._client.flushdb()
        return await fn(store)
    finally:
        await store.close()


def test_append_is_ordered_idempotent_and_bounded(store_url) -> None:
    async def scenario(store):
        key = KEYS.learner("learner-1")
        first = await store.append(key, events("learner-1", range(5)), keep=8, now_ms=1)
        assert (first.stored, first.duplicates, first.history_length) == (5, 0, 5)
        again = await store.append(key, events("learner-1", range(5)), keep=8, now_ms=2)
        assert (again.stored, again.duplicates, again.history_length) == (0, 5, 5)     # a retry stores nothing
        mixed = await store.append(key, events("learner-1", range(3, 9), start_q=200), keep=8, now_ms=3)
        assert (mixed.stored, mixed.duplicates, mixed.history_length) == (4, 2, 8)
        history = await store.history(key, 100)
        assert history.questions.tolist() == [100, 101, 102, 103, 104, 202, 203, 204, 205][-8:]
        more = await store.append(key, events("learner-1", range(9, 12), start_q=300), keep=8, now_ms=4)
        assert more.history_length == 8                                           # trimmed to keep
        history = await store.history(key, 3)
        assert history.questions.tolist() == [300, 301, 302] and history.correct.tolist() == [0, 1, 0]
        assert (await store.history(KEYS.learner("nobody"), 10)).questions.size == 0
    run(with_store(store_url, scenario))


def test_forget_removes_everything_of_one_learner(store_url) -> None:
    async def scenario(store):
        a, b = KEYS.learner("a"), KEYS.learner("b")
        await store.append(a, events("a", range(4)), keep=100, now_ms=1)
        await store.append(b, events("b", range(2)), keep=100, now_ms=1)
        assert await store.forget(a) == (True, 4)
        assert await store.forget(a) == (False, 0)
        assert await store.learner_keys() == [b]
        assert (await store.history(a, 10)).questions.size == 0
        again = await store.append(a, events("a", range(4)), keep=100, now_ms=2)
        assert again.stored == 4                                                  # nothing left to dedupe against
    run(with_store(store_url, scenario))


def test_the_log_revision_moves_with_appends_and_a_forgotten_learner_starts_elsewhere(store_url) -> None:
    async def scenario(store):
        key = KEYS.learner("r")
        assert (await store.history(key, 5)).revision is None                     # no events, no log
        first = await store.append(key, events("r", range(3)), keep=4, now_ms=1)
        read = await store.history(key, 1)
        assert read.revision == first.revision and read.revision.kept == 3 and read.questions.tolist() == [102]
        again = await store.append(key, events("r", range(3)), keep=4, now_ms=2)   # duplicates: no move
        assert again.revision == first.revision
        second = await store.append(key, events("r", range(3, 4), start_q=200), keep=4, now_ms=3)
        assert second.revision.appended_since(first.revision) == 1                # only appended
        trimmed = await store.append(key, events("r", range(4, 6), start_q=300), keep=4, now_ms=4)
        assert trimmed.revision.appended_since(second.revision) is None           # retention took the front
        assert trimmed.revision.kept == 4 == (await store.history(key, 9)).revision.kept
        await store.forget(key)
        reborn = await store.append(key, events("r", range(4, 6), start_q=300), keep=4, now_ms=5)
        assert reborn.revision.appended_since(trimmed.revision) is None           # a new log, a new base
        assert reborn.revision.appended_since(first.revision) is None
    run(with_store(store_url, scenario))


def test_concurrent_appends_of_one_learner_interleave_whole_requests(store_url) -> None:
    async def scenario(store):
        key = KEYS.learner("busy")

        async def writer(w: int):
            for r in range(10):
                ids = [f"{w}-{r}-{i}" for i in range(3)]
                evs = [StoredEvent(KEYS.event(key, e), 1000 * w + 10 * r + i, -2, 1, -1) for i, e in enumerate(ids)]
                await store.append(key, evs, keep=1000, now_ms=1)
        await asyncio.gather(*(writer(w) for w in range(1, 4)))
        questions = (await store.history(key, 1000)).questions.tolist()
        assert len(questions) == 90 and len(set(questions)) == 90
        for start in range(0, 90, 3):                                              # each request contiguous
            block = questions[start:start + 3]
            assert block == list(range(block[0], block[0] + 3))
        for w in range(1, 4):                                                      # each writer in its order
            mine = [q for q in questions if q // 1000 == w]
            assert mine == sorted(mine)
    run(with_store(store_url, scenario))


def test_sqlite_holds_no_raw_learner_or_event_id(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 's.sqlite3'}"

    async def scenario(store):
        await store.append(KEYS.learner("alice@example.org"), events("alice@example.org", ["evt-secret-1"]),
                           keep=10, now_ms=1)
    run(with_store(url, scenario))
    with sqlite3.connect(tmp_path / "s.sqlite3") as conn:
        dump = "\n".join(conn.iterdump())
    assert "alice" not in dump and "evt-secret" not in dump
    assert KEYS.learner("alice@example.org") in dump


def test_sqlite_expires_inactive_learners(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'ttl.sqlite3'}"

    async def scenario(store):
        await store.append(KEYS.learner("old"), events("old", range(2)), keep=10, now_ms=1_000)
        await store.append(KEYS.learner("new"), events("new", range(2)), keep=10, now_ms=100_000)
        assert await store.expire(now_ms=100_500) == 1
        assert await store.learner_keys() == [KEYS.learner("new")]
    run(with_store(url, scenario, ttl_s=60.0))


def test_redis_ttl_expires_a_learner(redis_server) -> None:
    async def scenario(store):
        key = KEYS.learner("short-lived")
        await store.append(key, events("short-lived", range(2)), keep=10, now_ms=1)
        assert (await store.history(key, 10)).questions.size == 2
        await asyncio.sleep(1.3)
        assert (await store.history(key, 10)).questions.size == 0
    run(with_store(redis_server.url, scenario, ttl_s=1.0))


def test_an_unreachable_redis_is_store_unavailable(tmp_path) -> None:
    from serving.processes import free_port

    async def scenario():
        store = open_store(f"redis://127.0.0.1:{free_port()}/0")
        with pytest.raises(StoreUnavailable):
            await store.ping()
        with pytest.raises(StoreUnavailable):
            await store.append(KEYS.learner("x"), events("x", [1]), keep=10, now_ms=1)
        await store.close()
    run(scenario())


@pytest.mark.parametrize("url", ["sqlite://", "mysql://x", "redis://127.0.0.1/0", "redis://127.0.0.1:1/zero"])
def test_bad_store_urls_are_one_line_user_errors(url: str) -> None:
    from routerkt.errors import UserError
    with pytest.raises(UserError, match="--store"):
        open_store(url)


def test_append_reports_which_events_were_new(store_url) -> None:
    async def scenario(store):
        key = KEYS.learner("learner-new")
        await store.append(key, events("learner-new", range(3)), keep=50, now_ms=1)
        result = await store.append(key, events("learner-new", [1, 5, 2, 6]), keep=50, now_ms=2)
        assert result.new == (False, True, False, True)
    run(with_store(store_url, scenario))


def test_served_entries_are_taken_once_replaced_by_newer_and_expire(store_url) -> None:
    from serving.sessions.store import ServedEntry

    async def scenario(store):
        NOW = int(time.time() * 1000)      # served entries expire on the store's clock (Redis: the server's)
        owner = KEYS.learner("learner-served")
        await store.remember_served([ServedEntry(owner, 5, "kt", 1, 0.25), ServedEntry(owner, 6, "kt", 1, 0.5),
                                     ServedEntry(owner, 5, "kt", 2, 0.75)], expires_ms=NOW + 10_000)
        await store.remember_served([ServedEntry(owner, 5, "kt", 1, 0.375)], expires_ms=NOW + 10_000)   # newer, same version
        taken = await store.take_served(owner, [5, 7], now_ms=NOW + 5_000)
        assert sorted((e.question_id, e.version, e.probability) for e in taken) == [(5, 1, 0.375), (5, 2, 0.75)]
        assert await store.take_served(owner, [5], now_ms=NOW + 5_000) == []                # taken once
        assert await store.take_served(owner, [6], now_ms=NOW + 20_000) == []               # expired
        other = "p" + "a" * 32
        await store.remember_served([ServedEntry(other, 9, "kt", 1, 0.125)], expires_ms=NOW + 10_000)
        await store.forget(KEYS.learner("learner-served"))
        assert [e.probability for e in await store.take_served(other, [9], now_ms=NOW)] == [0.125]
    run(with_store(store_url, scenario))


def test_forget_deletes_a_learners_served_entries(store_url) -> None:
    from serving.sessions.store import ServedEntry

    async def scenario(store):
        NOW = int(time.time() * 1000)
        owner = KEYS.learner("learner-forget-served")
        await store.remember_served([ServedEntry(owner, 3, "kt", 1, 0.5)], expires_ms=NOW + 10_000)
        await store.forget(owner)
        assert await store.take_served(owner, [3], now_ms=NOW) == []
    run(with_store(store_url, scenario))


def test_skill_sets_round_trip(store_url) -> None:
    sets = [(3, 17), 5, (), (-1,), (4, 5, 6)]

    async def scenario(store):
        key = KEYS.learner("sets")
        await store.append(key, [StoredEvent(KEYS.event(key, str(i)), 10 + i, s, 1) for i, s in enumerate(sets)],
                           keep=100, now_ms=1)
        history = await store.history(key, 100)
        assert history.skills.tolist() == [[3, 17, -2], [5, -2, -2], [-2, -2, -2], [-1, -2, -2], [4, 5, 6]]
        assert history.questions.tolist() == [10, 11, 12, 13, 14]
        assert (await store.history(key, 2)).skills.tolist() == [[-1, -2, -2], [4, 5, 6]]
        assert (await store.history(key, 4)).skills.tolist()[:2] == [[5, -2, -2], [-2, -2, -2]]
        two = (await store.history(key, 100)).skills[:2]                  # K: the widest set read
        assert two.tolist() == [[3, 17, -2], [5, -2, -2]]
    run(with_store(store_url, scenario))


OLD_EVENTS = ("CREATE TABLE events (learner TEXT NOT NULL, seq INTEGER NOT NULL, event_key TEXT NOT NULL, "
              "question INTEGER NOT NULL, skill INTEGER NOT NULL, correct INTEGER NOT NULL, ts INTEGER NOT NULL, "
              "PRIMARY KEY (learner, seq)) WITHOUT ROWID")


def test_sqlite_reads_a_file_written_before_skill_sets(tmp_path) -> None:
    path = tmp_path / "old.sqlite3"
    key = KEYS.learner("old")
    with sqlite3.connect(path) as conn:                          # the schema and rows of an older gateway
        conn.execute(OLD_EVENTS)
        conn.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?)",
                         [(key, 0, "e0", 100, 7, 1, -1), (key, 1, "e1", 101, -2, 0, -1)])
        conn.execute("CREATE TABLE learners (learner TEXT PRIMARY KEY, next_seq INTEGER NOT NULL, "
                     "count INTEGER NOT NULL, last_seen_ms INTEGER NOT NULL) WITHOUT ROWID")
        conn.execute("INSERT INTO learners VALUES (?, 2, 2, 1)", (key,))

    async def scenario(store):
        assert (await store.history(key, 10)).skills.tolist() == [[7], [-2]]
        await store.append(key, [StoredEvent(KEYS.event(key, "new"), 102, (8, 9), 1)], keep=10, now_ms=2)
        history = await store.history(key, 10)
        assert history.questions.tolist() == [100, 101, 102]
        assert history.skills.tolist() == [[7, -2], [-2, -2], [8, 9]]
    run(with_store(f"sqlite:///{path}", scenario))


def test_redis_reads_entries_written_before_skill_sets(redis_server) -> None:
    key = KEYS.learner("old")

    async def scenario(store):
        await store._client.rpush(f"rk:{{{key}}}:events", "100,7,1,-1", "101,-2,0,5")   # an older gateway's
        assert (await store.history(key, 10)).skills.tolist() == [[7], [-2]]
        await store.append(key, [StoredEvent(KEYS.event(key, "new"), 102, (8, 9), 1)], keep=10, now_ms=2)
        assert (await store.history(key, 10)).skills.tolist() == [[7, -2], [-2, -2], [8, 9]]
    run(with_store(redis_server.url, scenario))


def test_sqlite_small_reads_run_inline_and_fall_back_to_the_reader_thread(tmp_path) -> None:
    """A read of at most INLINE_READ_ROWS events runs on the event loop's own connection, sees a commit made
    through the writer thread at once, and is read by the reader thread when that connection fails."""
    from serving.sessions.sqlite_store import INLINE_READ_ROWS

    async def scenario(store):
        key = KEYS.learner("inline")
        await store.append(key, events("inline", range(6)), keep=50, now_ms=1)
        small = await store.history(key, INLINE_READ_ROWS)
        assert store._local.loop is not None                    # the loop thread's connection answered
        assert small.questions.tolist() == list(range(100, 106)) and small.revision.next - small.revision.first == 6
        await store.append(key, events("inline", range(6, 9), start_q=106), keep=50, now_ms=2)
        assert (await store.history(key, 2)).questions.tolist() == [107, 108]     # the newest commit is seen

        def broken():
            raise sqlite3.OperationalError("database is locked")
        store._loop_connection = broken
        fell_back = await store.history(key, 4)
        assert fell_back.questions.tolist() == [105, 106, 107, 108]
        assert fell_back.revision == (await store.history(key, 50)).revision
    run(with_store(f"sqlite:///{tmp_path / 'inline.sqlite3'}", scenario))
