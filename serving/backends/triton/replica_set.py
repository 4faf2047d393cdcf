"""Several Triton servers behind one gateway: `--triton-url A,B,...` (Settings.triton_urls).

    backend = triton_backend(settings, metrics)     # one URL: TritonInferenceBackend; several: this

TritonReplicaBackend is one InferenceBackend over N TritonInferenceBackend instances, one per URL,
each with its own client, supervisor and readiness probes (serving/backends/triton/backend.py), so a replica
that fails its probe, or an inference with UNAVAILABLE, is marked not ready by its own supervisor
and gets no more traffic until a later probe finds it ready again (a restarted Triton on the same
address is found again within about probe_interval_s plus the client's 1 s reconnect backoff).

- readiness: a version is ready when at least one replica serves it (the union); `serving` = some
  replica serves some model. The version policy chooses among that union as before.
- inference: round-robin over the replicas that have that model version ready now. A failure of
  kind UNAVAILABLE, STUB_CRASHED or NOT_LOADED (the replica, not the request, is at fault) is retried
  ONCE on another ready replica, with what is left of the caller's timeout (Predict is idempotent);
  DEADLINE, REJECTED and FAILED are not retried. Without another ready replica, or with less than
  MIN_RETRY_S left, the first error is raised. Step-graph calls (the learner-state path, serving/state/)
  go the same way: the learner's state travels with the request, so any replica answers it.
- held states (serving/state/placement.py): a held call goes to the replica that holds its keys: each key's
  slot ranks the replicas once (rendezvous hashing), and the first ready one in that order holds it, so
  a replica going out moves only its own learners. Rows of several replicas are split and sent together.
  A held_start failing as RETRYABLE is retried on the slot's next ready replica; a call naming a held key
  whose replica failed raises STATE_LOST (the gateway rebuilds, on the next replica).
- metrics: the replicas' supervisors do not write routerkt_triton_ready / routerkt_model_ready
  (they would overwrite each other); this backend sets them from all replicas (1 when any replica
  is ready / serves the model), plus routerkt_triton_replica_up{replica},
  routerkt_triton_replica_inferences_total{replica} and routerkt_triton_replica_retries_total{reason}.
  `replica` is the URL's index in --triton-url (the URLs are logged once at start), never the URL.
- /readyz (describe): "triton" (any replica ready) and "replicas": per index, whether its Triton
  answers, whether it serves, and its ready models.
"""
from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from routerkt.contract.step_signature import KEEP_AS, STATE_REF
from serving.backends.triton.backend import TritonInferenceBackend, tls_of
from serving.core.catalog import ModelCatalog, ModelVersion
from serving.metrics import Metrics, labelled
from serving.pipeline.parts import BackendError, FailureKind, InferenceBackend
from serving.settings import Settings
from serving.backends.triton.triton_client import TritonClient, control_headers
from serving.state.placement import SLOT_BITS, slots

log = logging.getLogger("routerkt.gateway.triton")

RETRYABLE = frozenset({FailureKind.UNAVAILABLE, FailureKind.STUB_CRASHED, FailureKind.NOT_LOADED})
MIN_RETRY_S = 0.01           # a retry needs at least this much of the caller's timeout left
GAUGE_POLL_S = 0.25          # how often the aggregate readiness gauges follow the replicas
LOG_EVERY_S = 5.0            # at most one "retried on another replica" line per replica this often
T = TypeVar("T")


def triton_backend(settings: Settings, metrics: Metrics) -> InferenceBackend:
    """The gateway's default backend for settings.triton_url: one Triton, or several replicas."""
    urls = settings.triton_urls
    if len(urls) == 1:
        return TritonInferenceBackend(settings, metrics,
                                      TritonClient(urls[0], metrics, control_headers(settings.triton_key_file),
                                                   tls_of(settings)))
    return TritonReplicaBackend(settings, metrics)


class _Discard:
    """A gauge (with or without labels) whose writes are dropped."""

    def labels(self, *args: object, **kwargs: object) -> _Discard:
        return self

    def set(self, value: float) -> None:
        pass


class _ReplicaMetrics:
    """What one replica's client and supervisor see as Metrics: everything shared, except the
    readiness gauges, which the replica backend sets from all replicas together."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self.triton_ready = _Discard()
        self.model_ready = _Discard()

    def __getattr__(self, name: str) -> object:
        return getattr(self._metrics, name)


@dataclass
class Replica:
    index: int
    name: str                     # the URL (logs only) or a test's label
    backend: InferenceBackend
    last_logged: float = float("-inf")

    def triton_up(self) -> bool:
        return bool(self.backend.describe().get("triton", self.backend.serving))


class TritonReplicaBackend:
    """InferenceBackend over several Triton servers (see the module docstring). `backends`: the
    per-replica backends to use instead of one TritonInferenceBackend per URL (tests)."""

    def __init__(self, settings: Settings, metrics: Metrics, backends: Sequence[InferenceBackend] | None = None,
                 names: Sequence[str] | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self._inferences = labelled(metrics.triton_replica_inferences)
        if backends is None:
            urls = settings.triton_urls
            view = _ReplicaMetrics(metrics)
            headers, tls = control_headers(settings.triton_key_file), tls_of(settings)
            backends = [TritonInferenceBackend(settings, view,  # type: ignore[arg-type]
                                               TritonClient(url, view, headers, tls)) for url in urls]
            names = urls
        if not backends:
            raise ValueError("TritonReplicaBackend needs at least one replica")
        names = list(names) if names is not None else [f"replica {i}" for i in range(len(backends))]
        self.replicas = [Replica(i, name, backend) for i, (name, backend) in enumerate(zip(names, backends))]
        self._turn = itertools.count()
        self._ranked = [sorted(self.replicas, key=lambda r: hashlib.blake2b(f"{slot}:{r.index}".encode(),
                                                                           digest_size=8).digest(), reverse=True)
                        for slot in range(1 << SLOT_BITS)]      # slot -> replicas in its rendezvous order
        self._catalog: ModelCatalog | None = None
        self._models_seen: set[str] = set()
        for replica in self.replicas:
            self.metrics.triton_replica_up.labels(replica=str(replica.index)).set(0)
            self.metrics.triton_replica_inferences.labels(replica=str(replica.index))
        for kind in sorted(RETRYABLE, key=lambda k: k.value):
            self.metrics.triton_replica_retries.labels(reason=kind.value)

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self, catalog: ModelCatalog) -> None:
        self._catalog = catalog
        log.info("Triton replicas: %s", ", ".join(f"{r.index}={r.name}" for r in self.replicas))
        results = await asyncio.gather(*(r.backend.start(catalog) for r in self.replicas), return_exceptions=True)
        failed = [(r, res) for r, res in zip(self.replicas, results) if isinstance(res, BaseException)]
        for replica, exc in failed:
            log.error("Triton replica %d did not start: %s", replica.index, type(exc).__name__)
        if len(failed) == len(self.replicas):
            raise failed[0][1]
        self.refresh_gauges()

    async def maintain(self, catalog: ModelCatalog) -> None:
        self._catalog = catalog
        await asyncio.gather(*(r.backend.maintain(catalog) for r in self.replicas), self._gauge_loop())

    async def _gauge_loop(self) -> None:
        while True:
            try:
                self.refresh_gauges()
            except Exception:                              # never let the loop die
                log.exception("updating the replica gauges failed")
            await asyncio.sleep(GAUGE_POLL_S)

    def wake(self) -> None:
        for replica in self.replicas:
            replica.backend.wake()

    async def close(self) -> None:
        await asyncio.gather(*(r.backend.close() for r in self.replicas), return_exceptions=True)

    # -- readiness -------------------------------------------------------------------------------
    @property
    def serving(self) -> bool:
        return any(r.backend.serving for r in self.replicas)

    def ready_versions(self, model: str) -> frozenset[int]:
        return frozenset().union(*(r.backend.ready_versions(model) for r in self.replicas))

    async def ensure_ready(self, model: str, version: int, timeout_s: float) -> bool:
        """Every replica asked to load it; True when at least one answers with it."""
        done = await asyncio.gather(*(r.backend.ensure_ready(model, version, timeout_s) for r in self.replicas),
                                    return_exceptions=True)
        return any(ok is True for ok in done)

    def ready_models(self) -> dict[str, list[int]]:
        union: dict[str, set[int]] = {}
        for replica in self.replicas:
            for model, versions in replica.backend.ready_models().items():
                union.setdefault(model, set()).update(versions)
        return {model: sorted(versions) for model, versions in union.items() if versions}

    def unavailable_reason(self, model: str) -> str | None:
        """None as soon as one replica serves `model`, or one replica has no reason against it
        (then the version policy decides); otherwise the first replica's reason."""
        if any(r.backend.ready_versions(model) for r in self.replicas):
            return None
        reasons = [r.backend.unavailable_reason(model) for r in self.replicas]
        return reasons[0] if all(reason is not None for reason in reasons) else None

    def describe(self) -> dict[str, object]:
        return {"triton": any(r.triton_up() for r in self.replicas),
                "replicas": [{"replica": r.index, "triton": r.triton_up(), "serving": r.backend.serving,
                              "models": r.backend.ready_models()} for r in self.replicas]}

    def refresh_gauges(self) -> None:
        """routerkt_triton_ready, routerkt_model_ready and routerkt_triton_replica_up from the replicas."""
        self.metrics.triton_ready.set(1 if any(r.triton_up() for r in self.replicas) else 0)
        for replica in self.replicas:
            self.metrics.triton_replica_up.labels(replica=str(replica.index)).set(1 if replica.backend.serving else 0)
        ready = self.ready_models()
        if self._catalog is not None:
            self._models_seen.update(self._catalog.snapshot())
        self._models_seen.update(ready)
        for model in self._models_seen:
            self.metrics.model_ready.labels(model=model).set(1 if ready.get(model) else 0)

    # -- inference -------------------------------------------------------------------------------
    def pick(self, model: ModelVersion, exclude: Replica | None = None) -> Replica | None:
        """The next replica, round-robin, among those that have `model` ready now (None: none)."""
        ready = [r for r in self.replicas
                 if r is not exclude and model.version in r.backend.ready_versions(model.name)]
        return ready[next(self._turn) % len(ready)] if ready else None

    async def infer(self, model: ModelVersion, feeds: dict[str, np.ndarray], timeout_s: float) -> np.ndarray:
        return await self._retried(model, timeout_s, lambda backend, left: backend.infer(model, feeds, left))

    async def _retried(self, model: ModelVersion, timeout_s: float,
                       send: Callable[[InferenceBackend, float], Awaitable[T]],
                       pick: Callable[[Replica | None], Replica | None] | None = None,
                       started: float | None = None, holds: bool = False) -> T:
        """`send(replica's backend, seconds left)` on `pick(None)` (default: the next ready replica,
        round-robin), once more on `pick(first)` after a RETRYABLE failure (module docstring); a call that
        names held states (`holds`) fails with STATE_LOST instead: its states went with the replica."""
        started = time.monotonic() if started is None else started
        pick = pick or (lambda exclude: self.pick(model, exclude))
        first = pick(None)
        if first is None:
            raise BackendError(FailureKind.UNAVAILABLE,
                               f"no Triton replica serves model {model.name} version {model.version} now")
        try:
            return await self._send(first, send, timeout_s - (time.monotonic() - started))
        except BackendError as exc:
            if exc.kind not in RETRYABLE:
                raise
            self.refresh_gauges()
            if holds:                                    # rebuilt elsewhere by the caller
                raise BackendError(FailureKind.STATE_LOST, f"replica {first.index}: {exc.kind.value}") from None
            remaining = timeout_s - (time.monotonic() - started)
            second = pick(first)
            if second is None or remaining < MIN_RETRY_S:
                raise
            self.metrics.triton_replica_retries.labels(reason=exc.kind.value).inc()
            now = time.monotonic()
            if now - first.last_logged >= LOG_EVERY_S:
                first.last_logged = now
                log.warning("Triton replica %d failed an inference (%s); retrying on replica %d "
                            "(logged at most every %.0fs per replica)", first.index, exc.kind.value, second.index,
                            LOG_EVERY_S)
        return await self._send(second, send, remaining)

    async def _send(self, replica: Replica, send: Callable[[InferenceBackend, float], Awaitable[T]],
                    timeout_s: float) -> T:
        self._inferences(replica=str(replica.index)).inc()
        return await send(replica.backend, timeout_s)

    async def infer_outputs(self, model: ModelVersion, feeds: dict[str, np.ndarray], outputs: tuple[str, ...],
                            timeout_s: float) -> dict[str, np.ndarray]:
        """The explain call (serving/queries/explain.py) on one replica, without a retry (an inspection)."""
        replica = self.pick(model)
        if replica is None:
            raise BackendError(FailureKind.UNAVAILABLE,
                               f"no Triton replica serves model {model.name} version {model.version} now")
        self._inferences(replica=str(replica.index)).inc()
        return await replica.backend.infer_outputs(model, feeds, outputs, timeout_s)

    def steps(self, model: ModelVersion) -> bool:
        """Every replica runs the version's step graphs (one repository: the state travels with each request,
        so any replica answers any learner)."""
        return all(replica.backend.steps(model) for replica in self.replicas)

    def holds_states(self, model: ModelVersion) -> bool:
        return all(replica.backend.holds_states(model) for replica in self.replicas)

    async def infer_step(self, model: ModelVersion, graph: str, feeds: dict[str, np.ndarray],
                         timeout_s: float) -> dict[str, np.ndarray]:
        """A step graph on the next ready replica, retried like `infer` (a read: repeating it is harmless);
        a held call on the replicas holding its keys (the module docstring)."""
        keys = feeds.get(STATE_REF.name, feeds.get(KEEP_AS.name))
        if keys is None:
            return await self._retried(model, timeout_s, lambda backend, left: backend.infer_step(
                model, graph, feeds, left))
        started, rows = time.monotonic(), {}
        for row, slot in enumerate(slots(keys).tolist()):
            holder = self.holder(model, slot)
            if holder is None:
                raise BackendError(FailureKind.UNAVAILABLE,
                                   f"no Triton replica serves model {model.name} version {model.version} now")
            rows.setdefault(holder.index, (holder, slot, []))[2].append(row)
        if len(rows) == 1:
            holder, slot, _ = next(iter(rows.values()))
            return await self._held(model, graph, feeds, holder, slot, timeout_s, started)
        parts = await asyncio.gather(*(self._held(model, graph, {n: a[picked] for n, a in feeds.items()}, holder, slot,
                                                  timeout_s, started) for holder, slot, picked in rows.values()))
        total = int(keys.shape[0])
        out = {n: np.empty((total, *a.shape[1:]), a.dtype) for n, a in parts[0].items()}
        for (_, _, picked), part in zip(rows.values(), parts):
            for n, a in part.items():
                out[n][picked] = a
        return out

    def holder(self, model: ModelVersion, slot: int, exclude: Replica | None = None) -> Replica | None:
        """The first replica in the slot's rendezvous order with `model` ready now (None: none)."""
        return next((r for r in self._ranked[slot] if r is not exclude
                     and model.version in r.backend.ready_versions(model.name)), None)

    async def _held(self, model: ModelVersion, graph: str, feeds: dict[str, np.ndarray], holder: Replica, slot: int,
                    timeout_s: float, started: float) -> dict[str, np.ndarray]:
        """A held call on the replica holding its slot, retried on the slot's next replica (a call that only
        keeps new states) or failed as STATE_LOST (one that names held states)."""
        send = lambda backend, left: backend.infer_step(model, graph, feeds, left)  # noqa: E731
        pick = lambda exclude: holder if exclude is None else self.holder(model, slot, exclude)  # noqa: E731
        return await self._retried(model, timeout_s, send, pick, started, holds=STATE_REF.name in feeds)
