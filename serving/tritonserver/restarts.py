"""Keeps the tritonserver that `routerkt serve` started alive: when it dies (a crash, an OOM kill,
a SIGKILL), its stubs and shared memory are cleaned up and it is started again on the same ports,
with backoff, a bounded number of times in a row. Meanwhile the gateway's readiness probe finds
Triton gone (health NOT_SERVING, calls UNAVAILABLE at once) and finds it again once it answers;
the gateway itself is never restarted. Restarts are counted in routerkt_triton_restarts_total.

An external Triton (`--triton-url`) is not ours to restart: the gateway only reconnects to it.
"""
from __future__ import annotations

import asyncio
import logging

from serving.metrics import Metrics
from serving.tritonserver.launcher import TritonServer

log = logging.getLogger("routerkt.serve.triton")

CHECK_S = 0.5                  # how often the process is checked
RECORD_STUBS_S = 2.0           # how often its python-backend stubs (and their shm) are recorded
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0)   # before each restart in a row; then it gives up
STABLE_S = 60.0                # a server up this long resets the count of restarts in a row
START_TIMEOUT_S = 180.0


class TritonRestarter:
    def __init__(self, server: TritonServer, metrics: Metrics) -> None:
        self.server = server
        self.metrics = metrics
        self.restarts_in_a_row = 0

    async def run(self) -> None:
        """Until cancelled (the gateway's shutdown): watch, clean up, restart."""
        loop = asyncio.get_running_loop()
        up_since = loop.time()
        last_record = 0.0
        while True:
            await asyncio.sleep(CHECK_S)
            if self.server.is_running():
                if loop.time() - last_record >= RECORD_STUBS_S:
                    last_record = loop.time()
                    await asyncio.to_thread(self.server.stub_pids)   # stubs of reloads, too
                if loop.time() - up_since >= STABLE_S:
                    self.restarts_in_a_row = 0
                continue
            code = await asyncio.to_thread(self.server.stop)           # reaps it; kills its stubs, removes shm
            if self.restarts_in_a_row >= len(BACKOFF_S):
                log.error("tritonserver died again (exit code %s) after %d restarts in a row; not restarting "
                          "(the gateway stays NOT_SERVING)", code, self.restarts_in_a_row)
                return
            delay = BACKOFF_S[self.restarts_in_a_row]
            self.restarts_in_a_row += 1
            log.error("tritonserver died (exit code %s); restarting it in %.0fs (attempt %d of %d)", code, delay,
                      self.restarts_in_a_row, len(BACKOFF_S))
            await asyncio.sleep(delay)
            try:
                await asyncio.to_thread(self.server.start, START_TIMEOUT_S)
            except Exception as exc:                                   # it failed to come up: next round
                log.error("restarting tritonserver failed: %s", str(exc).splitlines()[0][:300])
                continue
            self.metrics.triton_restarts.inc()
            up_since = loop.time()
            log.warning("tritonserver restarted (pid %s) on %s", self.server.pid, self.server.grpc_url)
