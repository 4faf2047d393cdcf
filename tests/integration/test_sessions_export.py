"""`routerkt sessions export` against a real SQLite file and a real redis-server: every acknowledged event once, in order, with its skill set; forgotten learners absent; streaming in bounded chunks."""
from __future__ import annotations

import asyncio
import csv
import io
import tracemalloc

import pytest

from routerkt.cli import main as routerkt_main
from serving.sessions.cli_sessions_export import export_events, export_to_file, user_id
from serving.sessions.factory import open_store
from serving.sessions.store import StoredEvent
from tests.integration.test_session_stores import KEYS, redis_server, store_url  # noqa: F401 (fixtures)
from tests.integration.test_session_stores import with_store as _with_store

pytestmark = pytest.mark.integration

def _event(learner_key: str, n: int) -> StoredEvent:
    skills = (n % 5, 10 + n % 3) if n % 4 == 0 else ((n % 5,) if n % 4 != 3 else ())
    return StoredEvent(KEYS.event(learner_key, f"e{n}"), 100 + n, skills, n % 2, 1_000 + 10 * n)


def _fill(url: str, learners: int, per_learner: int, forget: tuple[str, ...] = ()) -> dict[int, list[tuple]]:
    """Appends (with a retried, duplicate append) and forgets; returns user_id -> acknowledged rows in order."""
    expected: dict[int, list[tuple]] = {}

    async def scenario(store):
        for i in range(learners):
            name = f"learner-{i}"
            key = KEYS.learner(name)
            events = [_event(key, n + 7 * i) for n in range(per_learner)]
            half = per_learner // 2
            await store.append(key, events[:half], keep=1000, now_ms=1)
            again = await store.append(key, events, keep=1000, now_ms=2)          # a retry: the first half again
            assert again.duplicates == half
            if name not in forget:
                expected[user_id(key)] = [(e.question_id, ";".join(map(str, e.skills)) or "-1", e.correct,
                                           e.timestamp_ms) for e in events]
        for name in forget:
            await store.forget(KEYS.learner(name))
    asyncio.run(_with_store(url, scenario))
    return expected


def _read(path) -> dict[int, list[tuple]]:
    found: dict[int, list[tuple]] = {}
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            found.setdefault(int(row["user_id"]), []).append(
                (int(row["question_id"]), row["skill_id"], int(row["correct"]), int(row["timestamp_ms"]), int(row["order"])))
    return found


def test_every_event_once_in_order_with_skill_sets_and_no_forgotten_learner(store_url, tmp_path, capsys) -> None:
    expected = _fill(store_url, learners=12, per_learner=9, forget=("learner-3", "learner-8"))
    out = tmp_path / "events.csv"
    assert routerkt_main(["sessions", "export", "--store", store_url, "--out", str(out), "--chunk-learners", "5"]) == 0
    assert '"events": 90' in capsys.readouterr().out
    found = _read(out)
    assert set(found) == set(expected)                       # forgotten learners absent, the others present
    for uid, rows in found.items():
        assert [r[:4] for r in rows] == expected[uid]          # each once, in order, with the skill set
        assert [r[4] for r in rows] == sorted(r[4] for r in rows)
    assert all(uid < 2 ** 60 for uid in found)
    from training.data.csv_reader import read_interactions    # the canonical CSV training reads
    inter = read_interactions(out)
    assert len(inter) == 90 and inter.skill_id.shape[1] == 2


def test_since_until_filter_by_event_timestamp(store_url, tmp_path) -> None:
    expected = _fill(store_url, learners=3, per_learner=10)
    out = tmp_path / "window.csv.gz"
    stats = export_to_file(store_url, out, since=1_050, until=1_100)
    import gzip
    rows = list(csv.DictReader(io.StringIO(gzip.open(out).read().decode())))
    assert rows and all(1_050 <= int(r["timestamp_ms"]) < 1_100 for r in rows)
    assert stats.events == len(rows) == sum(1 for v in expected.values() for r in v if 1_050 <= r[3] < 1_100)


def test_export_streams_in_bounded_chunks(store_url) -> None:
    """A smaller store (6,000 events) read in chunks of 8 learners: no chunk holds more than 8 learners, and
    the traced peak memory stays a fraction of reading the whole store at once (the benchmark shows 1M)."""
    _fill(store_url, learners=200, per_learner=30)
    sizes: list[int] = []

    async def export(chunk: int) -> tuple[int, int]:
        async def go(store):
            original = store.stream

            async def counted(n):
                async for part in original(n):
                    sizes.append(len(part))
                    yield part
            store.stream = counted
            tracemalloc.start()
            try:
                stats = await export_events(store, _Discard(), chunk_learners=chunk)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            return stats.events, peak
        return await _with_store_keep(store_url, go)
    events_small, peak_small = asyncio.run(export(8))
    assert events_small == 6_000 and max(sizes) <= 8 and len(sizes) >= 200 // 8
    sizes.clear()
    events_all, peak_all = asyncio.run(export(1_000))
    assert events_all == 6_000 and max(sizes) == 200
    assert peak_small < 0.5 * peak_all, (peak_small, peak_all)


class _Discard(io.TextIOBase):
    def write(self, text: str) -> int:
        return len(text)


async def _with_store_keep(url, fn):
    store = open_store(url)
    await store.open()
    try:
        return await fn(store)
    finally:
        await store.close()


def test_unreachable_store_and_missing_file_are_one_line(tmp_path, capsys) -> None:
    out = tmp_path / "x.csv"
    assert routerkt_main(["sessions", "export", "--store", f"sqlite:///{tmp_path / 'none.sqlite3'}", "--out", str(out)]) == 2
    assert routerkt_main(["sessions", "export", "--store", "redis://127.0.0.1:1/0", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("is not available" in line for line in err)
    assert not out.exists() and not list(tmp_path.glob(".x.csv.*"))
