"""Learner sessions: the gateway keeps each learner's history in a durable store.

- keys.py           learner id -> keyed hash (HMAC-SHA256 with a server secret); ids never stored in clear
- store.py          the SessionStore interface, its events and errors, `open_store(url)`
- sqlite_store.py   embedded default: SQLite in WAL mode, synchronous FULL
- redis_store.py    several gateways: Redis / Valkey, atomic ordered appends in one Lua script
- events.py         Observe / ForgetLearner queries and their validation (INVALID_ARGUMENT + field)
- service.py        SessionService (Observe, ForgetLearner) and StoredHistory (the pipeline's HistorySource)
"""
