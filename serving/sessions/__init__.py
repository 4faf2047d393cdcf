"""Learner sessions: the gateway keeps each learner's history in a durable store.

- keys.py             learner id -> keyed hash (HMAC-SHA256 with a server secret); ids never stored in clear
- store.py            the SessionStore interface, its events and errors (imports no implementation)
- factory.py          `open_store(url)`: the implementation a URL names (sqlite://, redis://)
- sqlite_store.py     embedded default: SQLite in WAL mode, synchronous FULL
- redis_store.py      several gateways: Redis / Valkey, atomic ordered appends in one Lua script
- redis_server.py     a redis-server/valkey-server child process (tests, benchmarks)
- events.py           Observe / ForgetLearner queries and their validation (INVALID_ARGUMENT + field)
- session_service.py  SessionService (Observe, ForgetLearner, stored histories, store health)
- history.py          the pipeline's history sources: RequestHistory and SessionHistory
- cli_import.py       `routerkt sessions import`: bulk-load a canonical CSV into a store
- cli_export.py       `routerkt sessions export`: stream a store's events to the canonical CSV
"""
