"""Readiness and recovery of the models in one Triton server: which versions answer, and when to
reload or load a model. It owns that state; the inference path (serving/backends/triton/backend.py) only
reports failures to it.

Facts it is written around (docs/operations.md, "Triton 2.51 facts"):
- a crashed python-backend stub is NOT restarted by Triton 2.51: the model keeps reporting READY
  and every request fails with "Stub process '<model>_0_0' is not healthy". Only an unload + load
  through the model-control API (tritonserver runs with --model-control-mode=explicit) brings it
  back. `request_reload` does that in the background, one reload per model at a time, at most one
  per `reload_cooldown_s`, counted in routerkt_model_reloads_total{model, reason};
- readiness flags alone miss that, so `probe()` sends a tiny real inference (one padding row) to
  every loaded version; a stub crash, or `probe_failures_before_reload` consecutive failures of a
  model that still reports READY, triggers a reload.

- a load whose config.pbtxt changed makes Triton reload every version of the model; with calls in
  flight Triton 2.51 died (serving/backends/triton/gates.py). Such a load holds the model's calls
  (ModelGates), waits for those in flight, unloads, waits until Triton lists no instance, then
  loads (reason `config_changed`); a load with the served config runs beside the calls.

A version is "ready" when Triton lists it READY and its last probe succeeded. A failure on the
request path updates the state at once (Triton unreachable -> nothing is ready) and wakes the probe.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from typing import Mapping

from tritonclient.utils import InferenceServerException

from routerkt.contract.signature import CONFIG_FILE
from serving.catalog import ModelVersion
from serving.metrics import Metrics
from serving.parts import BackendError, FailureKind
from serving.settings import Settings
from serving.backends.triton.client import TritonClient
from serving.backends.triton.gates import ModelGates

log = logging.getLogger("routerkt.gateway.triton")

LOAD_RETRY_S = 60.0        # how often a failed (or refused) load of one version is retried
UNLOAD_POLL_S = 0.1        # how often an unload before a config-changing load is checked
BUSY_STATES = ("READY", "LOADING", "UNLOADING")     # Triton states of a version whose instance still exists


class TritonSupervisor:
    """The readiness state machine and reload policy for one Triton (use inside one event loop)."""

    def __init__(self, settings: Settings, metrics: Metrics, client: TritonClient) -> None:
        self.settings = settings
        self.metrics = metrics
        self.client = client
        self._triton_ready = False
        self._ready: dict[str, frozenset[int]] = {}      # model -> versions that answer inferences
        self._failures: dict[str, int] = {}              # model -> consecutive failed probes
        self._reloading: set[str] = set()
        self._locks: dict[str, asyncio.Lock] = {}
        self._last_reload: dict[str, float] = {}
        self._load_attempts: dict[tuple[str, int], float] = {}
        self._tasks: set[asyncio.Task] = set()
        self._wake = asyncio.Event()
        self.gates = ModelGates()                        # in-flight calls per model; closed while a load drains
        self._configs: dict[str, str | None] = {}        # model -> digest of the config.pbtxt Triton serves

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- state -----------------------------------------------------------------------------------
    @property
    def triton_ready(self) -> bool:
        return self._triton_ready

    def ready_versions(self, model: str) -> frozenset[int]:
        return self._ready.get(model, frozenset()) if self._triton_ready else frozenset()

    def is_reloading(self, model: str) -> bool:
        return model in self._reloading

    def ready_models(self) -> dict[str, list[int]]:
        return {m: sorted(v) for m, v in self._ready.items() if v} if self._triton_ready else {}

    @property
    def serving(self) -> bool:
        """Triton is ready and at least one model answers."""
        return self._triton_ready and any(self._ready.values())

    def wake(self) -> None:
        """Ask for a probe round now (the repository changed, a request failed, ...)."""
        self._wake.set()

    async def wait_wake(self, timeout: float) -> None:
        """Sleep up to `timeout`, or less if a failure asked for an early probe."""
        try:
            await asyncio.wait_for(self._wake.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        self._wake.clear()

    # -- what the request path reports -----------------------------------------------------------
    def on_failure(self, model: str, version: int, exc: BackendError) -> None:
        kind = exc.kind
        if kind is FailureKind.UNAVAILABLE:
            if self._triton_ready:
                log.warning("Triton at %s is unreachable; marking every model not ready", self.client.url)
            self._set_triton_down()
        elif kind is FailureKind.STUB_CRASHED:
            self._set_ready(model, frozenset())
            self.request_reload(model, "stub_crash")
        elif kind is FailureKind.NOT_LOADED:
            self._set_ready(model, self._ready.get(model, frozenset()) - {version})
        elif kind in (FailureKind.FAILED, FailureKind.REJECTED):
            log.error("Triton failed model %s version %s (%s): %s", model, version, kind.value, first_line(exc.detail))
        if kind is not FailureKind.DEADLINE:
            self._wake.set()

    # -- readiness probe -------------------------------------------------------------------------
    async def probe(self, table: Mapping[str, Mapping[int, ModelVersion]]) -> None:
        """One readiness round over every model of the catalog (see the module docstring)."""
        try:
            states = await self.client.model_states(self.settings.probe_timeout_s)
        except BackendError as exc:
            if self._triton_ready:
                log.warning("Triton at %s is not answering: %s", self.client.url, first_line(exc.detail))
            states = None
        if states is None:
            self._set_triton_down()
            return
        if not self._triton_ready:
            log.info("Triton at %s is ready", self.client.url)
        self._triton_ready = True
        self.metrics.triton_ready.set(1)
        await asyncio.gather(*(self._probe_model(name, versions, states.get(name, {}))
                               for name, versions in table.items()))
        for name in set(self._ready) - set(table):        # removed from the repository
            self._set_ready(name, frozenset())

    async def _probe_model(self, name: str, versions: Mapping[int, ModelVersion], states: dict[int, str]) -> None:
        if self.gates.is_closed(name):
            return                                               # draining for a load: calls wait, state stays
        if name in self._reloading or not versions:
            self._set_ready(name, frozenset())
            return
        loaded = sorted(v for v in versions if states.get(v) == "READY")
        latest = max(versions)
        if self.settings.manage_models and latest not in loaded:
            self._maybe_load(name, latest)
        previous = self._ready.get(name, frozenset())
        good: set[int] = set()
        for version in loaded:
            served = versions[version]
            try:                                                 # one padding row, like the warm-up
                async with self.gates.admitted(name, self.settings.probe_timeout_s) as left:
                    await self.client.infer(name, version, served.graph, served.probe_inputs(), left, observe=False)
            except BackendError as exc:
                self.on_failure(name, version, exc)
                if exc.kind is FailureKind.DEADLINE and version in previous:
                    good.add(version)                            # busy, not broken: keep the old verdict
                elif exc.kind in (FailureKind.FAILED, FailureKind.REJECTED):
                    self._failures[name] = self._failures.get(name, 0) + 1
                    if self._failures[name] >= self.settings.probe_failures_before_reload:
                        self.request_reload(name, "probe_failed")
                    elif version in previous:
                        good.add(version)
                if exc.kind in (FailureKind.UNAVAILABLE, FailureKind.STUB_CRASHED):
                    return                                       # state already updated by on_failure
                continue
            good.add(version)
            self._failures[name] = 0
        if name not in self._reloading:
            self._set_ready(name, frozenset(good))
            if good and name not in self._configs:
                self._configs[name] = self._config_digest(name)   # the config of the versions that answer

    # -- model control ---------------------------------------------------------------------------
    def request_reload(self, model: str, reason: str) -> None:
        """Schedule an unload + load of `model` (no-op while one is running for it)."""
        lock = self._locks.get(model)
        if model in self._reloading or (lock is not None and lock.locked()):
            return
        self._spawn(self.reload(model, reason))

    async def reload(self, model: str, reason: str) -> bool:
        """Unload and load `model` through Triton's model-control API; True when it loaded."""
        lock = self._locks.setdefault(model, asyncio.Lock())
        if lock.locked():
            return False                                        # someone else is reloading it
        async with lock:
            last = self._last_reload.get(model, -math.inf)
            if time.monotonic() - last < self.settings.reload_cooldown_s:
                log.warning("not reloading model %s again within %.1fs (reason: %s)", model,
                            self.settings.reload_cooldown_s, reason)
                return False
            self._last_reload[model] = time.monotonic()
            self._reloading.add(model)
            self._set_ready(model, frozenset())
            self.metrics.reloads.labels(model=model, reason=reason).inc()
            log.warning("reloading model %s through Triton's model-control API (reason: %s)", model, reason)
            started = time.perf_counter()
            try:
                await asyncio.wait_for(self._unload_then_load(model), self.settings.reload_timeout_s)
                log.info("model %s reloaded in %.1fs", model, time.perf_counter() - started)
                return True
            except (InferenceServerException, asyncio.TimeoutError) as exc:
                text = exc.message() if isinstance(exc, InferenceServerException) else "timed out"
                log.error("reloading model %s failed: %s", model, first_line(text))
                return False
            finally:
                self._reloading.discard(model)
                self._failures[model] = 0
                self._wake.set()

    async def _unload_then_load(self, model: str) -> None:
        """Unload, then load at once. Not waiting for the unload on purpose: with a dead stub the
        version stays UNLOADING for 30-40 s (Triton waits for the stub), while a load issued right
        away brings up a fresh instance in about 1.4 s (measured with Triton 2.51)."""
        await self.client.unload(model, self.settings.reload_timeout_s)
        await self.client.load(model, self.settings.reload_timeout_s)

    def _maybe_load(self, model: str, version: int) -> None:
        """Ask Triton (explicit mode) to load `model` when its latest repository version is not
        served; retried for the same version at most every LOAD_RETRY_S."""
        key = (model, version)
        if time.monotonic() - self._load_attempts.get(key, -math.inf) < LOAD_RETRY_S:
            return
        self._load_attempts[key] = time.monotonic()

        async def load() -> None:
            lock = self._locks.setdefault(model, asyncio.Lock())
            if lock.locked():
                return
            async with lock:
                digest = self._config_digest(model)
                if self._ready.get(model) and digest != self._configs.get(model):
                    # Triton reloads every version of the model: none of its calls may be in flight
                    log.warning("model %s: config.pbtxt changed with version %d; holding its calls while "
                                "Triton reloads every version", model, version)
                    started = time.perf_counter()
                    self.metrics.reloads.labels(model=model, reason="config_changed").inc()
                    async with self.gates.closed(model, self.settings.reload_timeout_s) as left:
                        if left:
                            log.error("model %s: %d calls still in flight after %.0fs; loading anyway",
                                      model, left, self.settings.reload_timeout_s)
                        loaded = await self._unload_and_load(model, version)
                    log.info("model %s: calls held for %.1fs", model, time.perf_counter() - started)
                else:
                    loaded = await self._load(model, version)
                if loaded:
                    self._configs[model] = digest
                self._wake.set()
        self._spawn(load())

    async def _load(self, model: str, version: int) -> bool:
        log.info("asking Triton to load model %s (version %d is in the repository)", model, version)
        try:
            await self.client.load(model, self.settings.reload_timeout_s)
            return True
        except InferenceServerException as exc:
            log.error("Triton did not load model %s: %s", model, first_line(exc.message()))
            return False

    async def _unload_and_load(self, model: str, version: int) -> bool:
        """Unload every version, wait until Triton lists none loaded or unloading, then load. A plain
        load would tear the old instances down about a second after it returns, while calls run again
        (the crash in gates.py)."""
        deadline = time.monotonic() + self.settings.reload_timeout_s
        try:
            await self.client.unload(model, self.settings.reload_timeout_s)
            while time.monotonic() < deadline:
                states = await self.client.model_states(self.settings.probe_timeout_s) or {}
                if not any(state in BUSY_STATES for state in states.get(model, {}).values()):
                    break
                await asyncio.sleep(UNLOAD_POLL_S)
        except (InferenceServerException, BackendError) as exc:
            log.error("Triton did not unload model %s: %s", model, first_line(getattr(exc, "detail", str(exc))))
        return await self._load(model, version)

    def _config_digest(self, model: str) -> str | None:
        """sha256 of the model's config.pbtxt in the repository (None: unreadable)."""
        try:
            return hashlib.sha256((self.settings.repository / model / CONFIG_FILE).read_bytes()).hexdigest()
        except OSError:
            return None

    # -- internals -------------------------------------------------------------------------------
    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _set_triton_down(self) -> None:
        self._triton_ready = False
        self.metrics.triton_ready.set(0)
        for name in list(self._ready):
            self._set_ready(name, frozenset())

    def _set_ready(self, model: str, versions: frozenset[int]) -> None:
        self._ready[model] = versions
        self.metrics.model_ready.labels(model=model).set(1 if versions else 0)


def first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0][:300] if text and text.strip() else ""
