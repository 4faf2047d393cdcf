"""The shared session store for several gateways: Redis or Valkey (redis-py's asyncio client).

Per learner key K (hash-tagged, so one learner's keys stay on one cluster slot):

    rk:{K}:events   list of "question,skills,correct,timestamp_ms", oldest first; skills is the
                    event's skill set "3;17" (one skill "3", none "-2": entries written before skill
                    sets read as sets of one)
    rk:{K}:ids      sorted set event key -> sequence number (idempotency over the kept events)
    rk:{K}:meta     hash: next (the next sequence number; a new learner's log starts at a random base,
                    serving/core/revision.py)
    rks:{O}         hash: question -> JSON [[model, version, probability, expires_ms], ...], the
                    predictions served to owner O (a learner key, or "p" + prediction id); the key
                    expires with its newest entry (outcome tracking)

An append is ONE Lua script, which Redis runs atomically: two gateways appending to the same
learner at once are serialised, each request's events stay contiguous and in order, and a retried
request finds its event keys and stores nothing twice. The script also trims to `keep` and sets
the TTL. Durability is the server's: the test and `make serve` start redis-server with
`--appendonly yes --appendfsync always`, so an acknowledged append is on disk.
"""
from __future__ import annotations

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, NoPermissionError, RedisError
from redis.retry import Retry

import json
from collections import defaultdict
from typing import AsyncIterator

from serving.core.revision import Revision, new_base
from serving.sessions.store import AppendResult, History, ServedEntry, StoredEvent, StoreUnavailable, parse_skills

APPEND = """
local keep = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local seq = tonumber(redis.call('HGET', KEYS[3], 'next') or ARGV[3])
local stored, duplicates = 0, 0
local flags = {}
for i = 4, #ARGV, 2 do
  if redis.call('ZSCORE', KEYS[2], ARGV[i]) then
    duplicates = duplicates + 1
    flags[#flags + 1] = 0
  else
    redis.call('RPUSH', KEYS[1], ARGV[i + 1])
    redis.call('ZADD', KEYS[2], seq, ARGV[i])
    seq = seq + 1
    stored = stored + 1
    flags[#flags + 1] = 1
  end
end
redis.call('HSET', KEYS[3], 'next', seq)
redis.call('LTRIM', KEYS[1], -keep, -1)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', seq - keep - 1)   -- a number, not a string: exact
if ttl > 0 then
  for j = 1, 3 do redis.call('PEXPIRE', KEYS[j], ttl) end
end
return {stored, duplicates, redis.call('LLEN', KEYS[1]), flags, seq}
"""
REMEMBER = """
local expires = tonumber(ARGV[1])
for i = 2, #ARGV, 4 do
  local question, model, version = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local current = redis.call('HGET', KEYS[1], question)
  local entries = current and cjson.decode(current) or {}
  local kept = {}
  for _, e in ipairs(entries) do
    if not (e[1] == model and e[2] == version) then kept[#kept + 1] = e end
  end
  kept[#kept + 1] = {model, version, ARGV[i + 3], expires}
  redis.call('HSET', KEYS[1], question, cjson.encode(kept))
end
redis.call('PEXPIREAT', KEYS[1], expires)
return 1
"""
TAKE = """
local out = {}
for i = 1, #ARGV do
  local value = redis.call('HGET', KEYS[1], ARGV[i])
  if value then
    redis.call('HDEL', KEYS[1], ARGV[i])
    out[#out + 1] = ARGV[i]
    out[#out + 1] = value
  end
end
return out
"""
# What an ACL user of this store needs (the scripts' commands included: Redis checks them too);
# serving/deploy/k8s/redis.yaml creates the user with exactly these (tests check it).
ACL_KEYS = ("rk:*", "rks:*")
ACL_COMMANDS = ("ping", "evalsha", "eval", "script|load", "script|exists", "lrange", "llen", "del", "multi",
                "exec", "scan", "select", "rpush", "zadd", "zscore", "zremrangebyscore", "hget", "hset", "hdel",
                "ltrim", "pexpire", "pexpireat")


def acl_rules() -> str:
    """The ACL rules of the store's user, less its password: keys and commands, nothing else."""
    return " ".join(["resetkeys", *(f"~{k}" for k in ACL_KEYS), "resetchannels", "-@all",
                     *(f"+{c}" for c in ACL_COMMANDS)])


SOCKET_TIMEOUT_S = 2.0         # one command; the caller's deadline bounds the call anyway
CONNECT_TIMEOUT_S = 0.5


def _keys(learner_key: str) -> list[str]:
    return [f"rk:{{{learner_key}}}:events", f"rk:{{{learner_key}}}:ids", f"rk:{{{learner_key}}}:meta"]


def _appended(reply: list) -> AppendResult:
    stored, duplicates, length, flags, next_seq = reply
    return AppendResult(int(stored), int(duplicates), int(length), tuple(bool(int(f)) for f in flags),
                        Revision(int(next_seq) - int(length), int(next_seq)) if int(length) else None)


def _served_key(owner: str) -> str:
    return f"rks:{{{owner}}}"


class CredentialsRefused(StoreUnavailable):
    """The server answered but refused this user or password (or the user may not PING): waiting
    does not fix that, so `routerkt serve` exits at start unless --store-wait (cli_serve.py)."""

    credentials_refused = True      # StoreUnavailable's flag


class RedisStore:
    kind = "redis"

    def __init__(self, host: str, port: int, db: int = 0, ttl_s: float = 0.0, username: str | None = None,
                 password: str | None = None, tls: bool = False, ca_file=None) -> None:
        self.ttl_s = ttl_s
        self.username = username or "default"
        ssl = {"ssl": True, "ssl_ca_certs": str(ca_file) if ca_file else None} if tls else {}
        self._client = aioredis.Redis(host=host, port=port, db=db, socket_timeout=SOCKET_TIMEOUT_S,
                                      socket_connect_timeout=CONNECT_TIMEOUT_S, retry=Retry(NoBackoff(), 0),
                                      decode_responses=True, username=username, password=password, **ssl)
        self._append = self._client.register_script(APPEND)
        self._remember = self._client.register_script(REMEMBER)
        self._take = self._client.register_script(TAKE)

    @property
    def path(self) -> None:
        """None: a server keeps the events, not a file of this host."""
        return None

    async def open(self) -> None:
        pass                      # connections are made on first use and remade after a failure

    async def close(self) -> None:
        await self._client.aclose()

    async def ping(self) -> None:
        try:
            await self._client.ping()
        except (AuthenticationError, NoPermissionError) as exc:
            what = "authentication failed" if isinstance(exc, AuthenticationError) else "PING is not allowed"
            raise CredentialsRefused(f"redis: {what} for user {self.username!r} (check "
                                     f"--store-password-file and the server's ACL)") from None
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis: {exc}") from None

    def _args(self, events: list[StoredEvent], keep: int) -> list[object]:
        args: list[object] = [keep, int(self.ttl_s * 1000), new_base()]
        for e in events:
            args += [e.event_key, f"{e.question_id},{e.skill_text},{e.correct},{e.timestamp_ms}"]
        return args

    async def append(self, learner_key: str, events: list[StoredEvent], keep: int, now_ms: int) -> AppendResult:
        try:
            reply = await self._append(keys=_keys(learner_key), args=self._args(events, keep))
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis: {exc}") from None
        return _appended(reply)

    async def append_many(self, batch: list[tuple[str, list[StoredEvent]]], keep: int,
                          now_ms: int) -> list[AppendResult]:
        """Several learners' appends in one pipeline (bulk import); each append stays atomic."""
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for learner_key, events in batch:
                    await self._append(keys=_keys(learner_key), args=self._args(events, keep), client=pipe)
                replies = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis: {exc}") from None
        return [_appended(reply) for reply in replies]

    async def history(self, learner_key: str, limit: int) -> History:
        events, _, meta = _keys(learner_key)
        try:
            async with self._client.pipeline(transaction=True) as pipe:    # MULTI: the events and the log at once
                pipe.lrange(events, -max(limit, 1), -1)
                pipe.hget(meta, "next")
                pipe.llen(events)
                items, next_seq, length = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis: {exc}") from None
        items = items if limit > 0 else []
        revision = Revision(int(next_seq) - int(length), int(next_seq)) if next_seq is not None and length else None
        rows, sets = [], {}
        for i, item in enumerate(items):
            question, skills, correct = item.split(",")[:3]
            if ";" in skills:
                sets[i] = parse_skills(skills)
                skills = skills.split(";", 1)[0]
            rows.append((int(question), int(skills), int(correct)))
        return History.from_rows(rows, sets, revision)

    async def forget(self, learner_key: str) -> tuple[bool, int]:
        keys = _keys(learner_key)
        try:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.llen(keys[0])
                pipe.delete(*keys, _served_key(learner_key))
                length, removed = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis: {exc}") from None
        return int(removed) > 0, int(length)

    async def expire(self, now_ms: int) -> int:
        """Nothing to do: an inactive learner's keys expire by themselves (the append sets their TTL)."""
        return 0

    async def learner_keys(self) -> list[str]:
        found: set[str] = set()
        try:
            async for key in self._client.scan_iter(match="rk:{*}:*", count=1000):
                found.add(key.split("{", 1)[1].split("}", 1)[0])
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis: {exc}") from None
        return sorted(found)

    async def stream(self, chunk_learners: int) -> AsyncIterator[list[tuple[str, list[StoredEvent]]]]:
        """SCAN over the learners' event lists, then one pipeline of LRANGEs per chunk. SCAN may return a
        key twice (a rehash during the scan): the learner keys already sent are remembered (32 bytes
        each, not their events), so each learner comes once."""
        seen: set[str] = set()
        pending: list[str] = []
        cursor = 0
        chunk_learners = max(1, chunk_learners)
        try:
            while True:
                cursor, found = await self._client.scan(cursor=cursor, match="rk:{*}:events",
                                                        count=max(chunk_learners, 100))
                for key in found:
                    learner = key.split("{", 1)[1].split("}", 1)[0]
                    if learner not in seen:
                        seen.add(learner)
                        pending.append(learner)
                while len(pending) >= chunk_learners or (int(cursor) == 0 and pending):
                    batch, pending = pending[:chunk_learners], pending[chunk_learners:]
                    chunk = await self._read_learners(batch)
                    if chunk:
                        yield chunk
                if int(cursor) == 0:
                    return
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis: {exc}") from None

    async def _read_learners(self, learners: list[str]) -> list[tuple[str, list[StoredEvent]]]:
        async with self._client.pipeline(transaction=False) as pipe:
            for learner in learners:
                pipe.lrange(_keys(learner)[0], 0, -1)
            lists = await pipe.execute()
        out = []
        for learner, items in zip(learners, lists):
            events = []
            for item in items:
                question, skills, correct, timestamp = item.split(",")[:4]
                events.append(StoredEvent("", int(question), parse_skills(skills), int(correct), int(timestamp)))
            if events:
                out.append((learner, events))
        return out

    # -- served predictions (outcome tracking) -----------------------------------------------------
    async def remember_served(self, entries: list[ServedEntry], expires_ms: int) -> None:
        by_owner: dict[str, list[object]] = defaultdict(list)
        for e in entries:
            by_owner[e.owner] += [e.question_id, e.model, e.version, repr(float(e.probability))]
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for owner, args in by_owner.items():
                    await self._remember(keys=[_served_key(owner)], args=[expires_ms, *args], client=pipe)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis: {exc}") from None

    async def take_served(self, owner: str, questions: list[int], now_ms: int) -> list[ServedEntry]:
        questions = sorted(set(questions))
        if not questions:
            return []
        try:
            flat = await self._take(keys=[_served_key(owner)], args=questions)
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis: {exc}") from None
        out = []
        for question, value in zip(flat[::2], flat[1::2]):
            for model, version, probability, expires in json.loads(value):
                if int(expires) > now_ms:
                    out.append(ServedEntry(owner, int(question), str(model), int(version), float(probability)))
        return out

    async def sweep_served(self, now_ms: int) -> int:
        """Nothing to do: an owner's key expires with its newest entry (REMEMBER sets PEXPIREAT), and
        `take_served` skips the older expired entries of a key that lives on."""
        return 0
