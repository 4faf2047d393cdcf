"""The gateway's calls to its session store: bounded by the caller's deadline, timed, and the store's health.

One StoreCalls per gateway, shared by the parts that read or write the store through it: the
history source (SessionHistory reads a named learner's answers before the prediction) and the
SessionService (Observe, ForgetLearner, ReportOutcome). It is the Background part that opens the
store, pings it (routerkt_store_up) and expires inactive learners.
"""
from __future__ import annotations

import asyncio
import logging
import sys
import time

from serving import status_errors as errors
from serving.core.calls import Deadline
from serving.metrics import Metrics, labelled
from serving.sessions.store import History, SessionStore, StoreUnavailable
from serving.settings import Settings

log = logging.getLogger("routerkt.gateway.sessions")

UNAVAILABLE = "the session store is not available; retry shortly"


class StoreCalls:
    """A session store's calls with deadlines, metrics and health (see the module docstring)."""

    def __init__(self, settings: Settings, store: SessionStore, metrics: Metrics) -> None:
        self.settings, self.store, self.metrics = settings, store, metrics
        self._seconds = labelled(metrics.store_seconds)
        self.up = False

    async def start(self) -> None:
        try:
            await self.store.open()
            await self.store.ping()
            self._set_up(True)
        except StoreUnavailable as exc:
            log.error("session store (%s) is not available: %s", self.store.kind, str(exc)[:300])
            self._set_up(False)

    async def close(self) -> None:
        await self.store.close()

    async def maintain(self) -> None:
        """Ping the store (health) and, every store_expiry_s, expire its inactive learners (SessionStore.expire)."""
        last_expiry = time.monotonic()
        while True:
            await asyncio.sleep(self.settings.store_probe_s)
            try:
                await asyncio.wait_for(self.store.ping(), self.settings.store_probe_s)
                self._set_up(True)
                if time.monotonic() - last_expiry > self.settings.store_expiry_s:
                    last_expiry = time.monotonic()
                    gone = await self.store.expire(int(time.time() * 1000))
                    if gone:
                        log.info("session store: %d inactive learners expired", gone)
            except (StoreUnavailable, asyncio.TimeoutError):
                self._set_up(False)
            except Exception:                                  # never let the loop die
                log.exception("session store upkeep failed")

    def _set_up(self, up: bool) -> None:
        if up != self.up:
            level = logging.INFO if up else logging.WARNING
            log.log(level, "session store (%s) is %s", self.store.kind, "available" if up else "NOT available")
        self.up = up
        self.metrics.store_up.set(1 if up else 0)

    async def history(self, learner_key: str, limit: int, deadline: Deadline, operation: str = "history") -> History:
        """The last `limit` answers of the learner keyed `learner_key` (`operation`: the metrics' label;
        "history_since": the few newest ones, to continue a cached learner state)."""
        return await self.call(operation, self.store.history(learner_key, limit), deadline)

    async def call(self, operation: str, coro, deadline: Deadline):
        """Await the store's `coro` within the caller's deadline: DEADLINE_EXCEEDED past it, UNAVAILABLE
        when the store fails (health marked down), timed per operation."""
        timeout = deadline.remaining() - self.settings.deadline_margin_s
        if timeout <= 0:                                 # the caller's time is up: the store is not asked
            coro.close()
            raise errors.deadline_exceeded("the call's deadline passed before the session store was asked")
        started = time.perf_counter()
        try:
            result = await _within(coro, timeout)
        except asyncio.TimeoutError:
            self.metrics.store_errors.labels(operation=operation).inc()
            log.warning("session store %s did not answer within the call's deadline (%.3fs)", operation, timeout)
            raise errors.deadline_exceeded("the session store did not answer within the call's deadline") from None
        except StoreUnavailable as exc:
            coro.close()
            self.metrics.store_errors.labels(operation=operation).inc()
            self._set_up(False)
            log.warning("session store %s failed: %s", operation, str(exc)[:300])
            raise errors.unavailable(UNAVAILABLE) from None
        finally:
            self._seconds(operation=operation).observe(time.perf_counter() - started)
        self._set_up(True)
        return result


async def _within(coro, timeout: float):
    """`await coro`, TimeoutError after `timeout` s; in the caller's own task where asyncio.timeout exists
    (Python 3.11+: no task and loop turn more per store call), else through asyncio.wait_for."""
    if sys.version_info < (3, 11):
        return await asyncio.wait_for(coro, timeout)
    async with asyncio.timeout(timeout):
        return await coro
