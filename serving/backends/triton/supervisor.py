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
  loads (reason `config_changed`), and lets the calls go only once Triton lists no version LOADING
  and each READY one answered a probe: the ready set the held calls meet is the reloaded one. A
  load with the served config runs beside the calls;
- generated configs serve every version folder (`version_policy: all`), so one load brings up every
  version of the repository: a probe round asks for a load when ANY of the model's versions is not
  loaded (at most once per LOAD_RETRY_S per version), and `ensure_loaded` does it at once for one
  version (a rollout that pins a version which is in the repository but not loaded).

A version is "ready" when Triton lists it READY and its last probe succeeded. A failure on the
request path updates the state at once (Triton unreachable -> nothing is ready) and wakes the probe.
The model-control calls themselves (load, unload, the waits on Triton's states) are
serving/backends/triton/model_control.py's.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Mapping

from tritonclient.utils import InferenceServerException

from serving.core.catalog import ModelVersion
from serving.metrics import Metrics
from serving.pipeline.parts import BackendError, FailureKind
from serving.settings import Settings
from serving.backends.triton.triton_client import TritonClient
from serving.backends.triton.gates import ModelGates
from serving.backends.triton.model_control import TritonModelControl, first_line

log = logging.getLogger("routerkt.gateway.triton")

LOAD_RETRY_S = 60.0        # how often a failed (or refused) load of one version is retried
ENSURE_POLL_S = 0.1        # how often ensure_loaded looks at Triton's state of the version
NO_LOAD_NEEDED = ("READY", "LOADING")               # states of a version a probe round asks no load for


class TritonSupervisor:
    """The readiness state machine and reload policy for one Triton (use inside one event loop)."""

    def __init__(self, settings: Settings, metrics: Metrics, client: TritonClient) -> None:
        self.settings = settings
        self.metrics = metrics
        self.client = client
        self.control = TritonModelControl(settings, client)
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
        self._table: Mapping[str, Mapping[int, ModelVersion]] = {}   # the catalog of the last probe round
        # model -> a counter bumped whenever something else set its ready set (a config-changing load,
        # ensure_loaded): a probe round that read Triton's states before that does not overwrite it
        self._epochs: dict[str, int] = {}

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
        if kind is FailureKind.STATE_LOST:               # the model is fine: the caller rebuilds the state
            return
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
        self._table = table
        epochs = dict(self._epochs)
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
        await asyncio.gather(*(self._probe_model(name, versions, states.get(name, {}), epochs.get(name, 0))
                               for name, versions in table.items()))
        for name in set(self._ready) - set(table):        # removed from the repository
            self._set_ready(name, frozenset())

    async def _probe_model(self, name: str, versions: Mapping[int, ModelVersion], states: dict[int, str],
                           epoch: int) -> None:
        if self.gates.is_closed(name) or self._epochs.get(name, 0) != epoch:
            return          # draining for a load (calls wait, state stays), or `states` predate its ready set
        if name in self._reloading or not versions:
            self._set_ready(name, frozenset())
            return
        loaded = sorted(v for v in versions if states.get(v) == "READY")
        missing = [v for v in versions if states.get(v) not in NO_LOAD_NEEDED]
        if self.settings.manage_models and missing:
            self._maybe_load(name, missing)                      # one load brings every version (policy `all`)
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
        if name not in self._reloading and self._epochs.get(name, 0) == epoch:
            self._set_ready(name, frozenset(good))
            if good and name not in self._configs:
                self._configs[name] = self.control.config_digest(name)   # the config of the versions that answer

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
                await asyncio.wait_for(self.control.unload_then_load(model), self.settings.reload_timeout_s)
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

    def _maybe_load(self, model: str, versions: list[int]) -> None:
        """Ask Triton (explicit mode) to load `model` because `versions` of the repository are not
        loaded; each version is asked for at most every LOAD_RETRY_S. Nothing while a load or reload
        of the model runs (the next probe round looks again)."""
        lock = self._locks.get(model)
        if lock is not None and lock.locked():
            return
        now = time.monotonic()
        due = [v for v in versions if now - self._load_attempts.get((model, v), -math.inf) >= LOAD_RETRY_S]
        if not due:
            return
        for version in due:
            self._load_attempts[(model, version)] = now
        self._spawn(self._load_model(model, max(due)))

    async def _load_model(self, model: str, version: int, wait: bool = False) -> bool:
        """The one locked path of every load: a plain load when the config.pbtxt Triton serves is
        unchanged, else the held, unload-first load of `_config_changing_load`. `wait`: wait for a load
        or reload that holds the lock, then load only when `version` is still not READY. True when
        Triton loaded the model (or already had the version READY)."""
        lock = self._locks.setdefault(model, asyncio.Lock())
        if lock.locked() and not wait:
            return False
        async with lock:
            if wait and await self.control.version_state(model, version, self.settings.probe_timeout_s) == "READY":
                return True                                      # the load we waited for brought it
            digest = self.control.config_digest(model)
            if self._ready.get(model) and digest != self._configs.get(model):
                loaded = await self._config_changing_load(model, version)
            else:
                loaded = await self.control.load(model, version)
            if loaded:
                self._configs[model] = digest
            self._wake.set()
            return loaded

    async def _config_changing_load(self, model: str, version: int) -> bool:
        """Triton reloads every version of the model: none of its calls may be in flight. Held calls
        go again only once the model's ready set is the reloaded one (`_settle`)."""
        log.warning("model %s: config.pbtxt changed with version %d; holding its calls while Triton reloads "
                    "every version", model, version)
        started = time.perf_counter()
        self.metrics.reloads.labels(model=model, reason="config_changed").inc()
        async with self.gates.closed(model, self.settings.reload_timeout_s) as left:
            try:
                if left:
                    log.error("model %s: %d calls still in flight after %.0fs; loading anyway",
                              model, left, self.settings.reload_timeout_s)
                loaded = await self.control.unload_and_load(model, version)
                ready = await self._settle(model)
            finally:
                self._bump(model)                                # before the gate opens: stale rounds skip
        log.info("model %s: calls held for %.1fs; versions ready after the load: %s", model,
                 time.perf_counter() - started, sorted(ready))
        return loaded

    async def _settle(self, model: str) -> frozenset[int]:
        """With the model's calls held after a load: wait (up to reload_timeout_s) until Triton lists
        none of its versions LOADING, probe each READY version of the catalog (the gate is closed, so
        the probe goes straight to Triton) and make the ones that answer the model's ready set. Calls
        let go then never meet a version that Triton is still bringing up, nor one it left out."""
        versions = self._table.get(model, {})
        states = await self.control.settled_states(model)
        good: set[int] = set()
        for version, served in sorted(versions.items()):
            if states.get(version) != "READY":
                continue
            try:
                await self.client.infer(model, version, served.graph, served.probe_inputs(),
                                        self.settings.probe_timeout_s, observe=False)
            except BackendError as exc:
                log.warning("model %s version %d: no answer to the probe after the load (%s)", model, version,
                            exc.kind.value)
                continue
            good.add(version)
        self._failures[model] = 0
        self._set_ready(model, frozenset(good))
        return frozenset(good)

    async def ensure_loaded(self, model: str, version: int, timeout_s: float) -> bool:
        """Make `version` of `model` answer within `timeout_s`: when its folder is in the repository
        but Triton does not list it READY, ask Triton to load the model (the locked path of the probe
        rounds' loads, at once: no LOAD_RETRY_S wait), then wait until Triton lists it READY and a
        probe inference answers. True when the version is ready (at once when it already was); False
        when its folder is not in the repository, Triton refused the load, or the time ran out. With
        manage_models off it asks for no load, and only waits."""
        deadline = time.monotonic() + timeout_s
        if version in self.ready_versions(model):
            return True
        if not (self.settings.repository / model / str(version)).is_dir():
            return False
        asked: asyncio.Task | None = None
        while True:
            if version in self.ready_versions(model):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            state = await self.control.version_state(model, version, min(self.settings.probe_timeout_s, left))
            served = self._table.get(model, {}).get(version)
            if state == "READY":
                if served is not None and await self._probe_version(model, served, deadline):
                    return True
            elif state is not None and state != "LOADING" and self.settings.manage_models:
                if asked is None:
                    self._load_attempts[(model, version)] = time.monotonic()
                    asked = self._spawn(self._load_model(model, version, wait=True))
                elif asked.done() and (asked.cancelled() or asked.exception() is not None or not asked.result()):
                    log.warning("model %s version %d: Triton did not load it", model, version)
                    return False
            self._wake.set()                                     # a probe round; the catalog may not list it yet
            await asyncio.sleep(max(min(ENSURE_POLL_S, deadline - time.monotonic()), 0.0))

    async def _probe_version(self, model: str, served: ModelVersion, deadline: float) -> bool:
        """One probe inference of a version Triton lists READY (through the gate: a load holding the
        model's calls is waited for); when it answers, the version joins the ready set."""
        timeout = min(self.settings.probe_timeout_s, deadline - time.monotonic())
        if timeout <= 0 or model in self._reloading:
            return False
        try:
            async with self.gates.admitted(model, timeout) as left:
                await self.client.infer(model, served.version, served.graph, served.probe_inputs(), left,
                                        observe=False)
        except BackendError as exc:
            log.info("model %s version %d: probe failed (%s)", model, served.version, exc.kind.value)
            return False
        if model in self._reloading:
            return False
        self._bump(model)
        self._set_ready(model, self._ready.get(model, frozenset()) | {served.version})
        return True

    # -- internals -------------------------------------------------------------------------------
    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _bump(self, model: str) -> None:
        self._epochs[model] = self._epochs.get(model, 0) + 1

    def _set_triton_down(self) -> None:
        self._triton_ready = False
        self.metrics.triton_ready.set(0)
        for name in list(self._ready):
            self._set_ready(name, frozenset())

    def _set_ready(self, model: str, versions: frozenset[int]) -> None:
        self._ready[model] = versions
        self.metrics.model_ready.labels(model=model).set(1 if versions else 0)
