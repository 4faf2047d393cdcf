"""The Predict / PredictBatch logic (`PredictionService`, shared by gRPC and the HTTP mirror) and the
gRPC servicer that exposes it (`KnowledgeTracingServicer`).

One call: take an in-flight slot (RESOURCE_EXHAUSTED when none is free) -> validate
(INVALID_ARGUMENT + field) -> resolve model and version (NOT_FOUND; UNAVAILABLE when Triton does
not serve it right now) -> map ids and build windows (serving/features.py) -> Triton, with the
caller's remaining deadline as client timeout (DEADLINE_EXCEEDED) -> probabilities at the last
position. All candidates of one learner go in one Triton request; a batch packs whole learners into
requests of at most min(max_rows_per_infer, the model's max_batch_size) rows, sent concurrently.
Every failure a client sees is a ServingError with a safe message: tracebacks and Triton's texts go
to the log only, and nothing about a learner (ids, histories) is logged.
"""
from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator

import grpc
import numpy as np

from serving import errors
from serving.errors import ServingError
from serving.features import EncodedLearner, build_windows, encode_learner
from serving.metrics import Metrics
from serving.models import ModelRegistry, ModelVersion
from serving.proto.routerkt.v1 import knowledge_tracing_pb2 as pb
from serving.proto.routerkt.v1 import knowledge_tracing_pb2_grpc as pb_grpc
from serving.settings import Settings
from serving.triton_backend import BackendError, FailureKind, TritonBackend
from serving.validation import LearnerInput, validate_batch, validate_predict

log = logging.getLogger("routerkt.gateway.service")

MISS_REFRESH_S = 1.0        # an unknown model/version rescans the repository at most this often


@dataclass
class Deadline:
    """Absolute deadline on the monotonic clock."""

    expires_at: float

    @classmethod
    def after(cls, seconds: float) -> "Deadline":
        return cls(time.monotonic() + seconds)

    def remaining(self) -> float:
        return self.expires_at - time.monotonic()


class PredictionService:
    """Transport-independent Predict / PredictBatch."""

    def __init__(self, settings: Settings, registry: ModelRegistry, backend: TritonBackend, metrics: Metrics) -> None:
        self.settings = settings
        self.registry = registry
        self.backend = backend
        self.metrics = metrics
        self._slots = asyncio.Semaphore(settings.max_inflight)
        self._last_miss_refresh = -1e9

    # -- public ----------------------------------------------------------------------------------
    async def predict(self, request: pb.PredictRequest, deadline: Deadline) -> pb.PredictResponse:
        async with self._call():
            learner = validate_predict(request, self.settings)
            self._observe_sizes([learner])
            model = await self._resolve(request.model, request.version)
            encoded = self._encode([learner], model)
            probs = await self._infer(model, encoded, deadline)
            return pb.PredictResponse(probabilities=probs[0].tolist(), model=model.name, version=model.version,
                                      history_used=encoded[0].history_used)

    async def predict_batch(self, request: pb.PredictBatchRequest, deadline: Deadline) -> pb.PredictBatchResponse:
        async with self._call():
            learners = validate_batch(request, self.settings)
            self._observe_sizes(learners)
            model = await self._resolve(request.model, request.version)
            encoded = self._encode(learners, model)
            probs = await self._infer(model, encoded, deadline)
            results = [pb.LearnerResult(probabilities=p.tolist(), history_used=e.history_used)
                       for p, e in zip(probs, encoded)]
            return pb.PredictBatchResponse(results=results, model=model.name, version=model.version)

    # -- steps -----------------------------------------------------------------------------------
    @asynccontextmanager
    async def _call(self) -> AsyncIterator[None]:
        """In-flight slot + error accounting + the last line of defence against leaking internals."""
        acquired = False
        try:
            await self._acquire()
            acquired = True
            self.metrics.inflight.inc()
            yield
        except ServingError as exc:
            self.metrics.errors.labels(code=exc.code_name).inc()
            raise
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except Exception:
            log.exception("unexpected error while serving a prediction")
            self.metrics.errors.labels(code=grpc.StatusCode.INTERNAL.name).inc()
            raise errors.internal() from None
        finally:
            if acquired:
                self.metrics.inflight.dec()
                self._slots.release()

    async def _acquire(self) -> None:
        if not self._slots.locked():
            await self._slots.acquire()                      # free slot: returns without suspending
            return
        wait = self.settings.inflight_wait_s
        if wait > 0:
            try:
                await asyncio.wait_for(self._slots.acquire(), wait)
                return
            except asyncio.TimeoutError:
                pass
        raise errors.resource_exhausted(f"the gateway is serving its maximum of {self.settings.max_inflight} "
                                        "calls; retry with backoff")

    def _observe_sizes(self, learners: list[LearnerInput]) -> None:
        for learner in learners:
            self.metrics.history_length.observe(learner.history_length)
            self.metrics.candidates.observe(learner.n_candidates)

    async def _resolve(self, name: str, version: int) -> ModelVersion:
        """The ModelVersion to use: NOT_FOUND when the repository lacks it, UNAVAILABLE when Triton
        does not serve it right now."""
        try:
            versions = self.registry.require_model(name)
            if version and version not in versions:
                raise errors.not_found(f"model {name!r} has no version {version} (versions: {sorted(versions)})",
                                       field="version")
        except ServingError:
            if not await self._refresh_on_miss():
                raise
            versions = self.registry.require_model(name)
            if version and version not in versions:
                raise errors.not_found(f"model {name!r} has no version {version} (versions: {sorted(versions)})",
                                       field="version") from None
        ready = self.backend.ready_versions(name)
        if self.backend.is_reloading(name):
            raise errors.unavailable(f"model {name!r} is being reloaded; retry shortly")
        if not self.backend.triton_ready:
            raise errors.unavailable("the inference server is not available; retry shortly")
        if version:
            if version not in ready:
                raise errors.unavailable(f"model {name!r} version {version} is not ready; retry shortly")
            return versions[version]
        usable = [v for v in versions if v in ready]
        if not usable:
            raise errors.unavailable(f"model {name!r} is not ready; retry shortly")
        return versions[max(usable)]

    async def _refresh_on_miss(self) -> bool:
        """Rescan the repository (rate-limited) so a fresh export is found; True if it changed."""
        now = time.monotonic()
        if now - self._last_miss_refresh < MISS_REFRESH_S:
            return False
        self._last_miss_refresh = now
        result = await asyncio.to_thread(self.registry.refresh)
        return bool(result.added or result.removed)

    def _encode(self, learners: list[LearnerInput], model: ModelVersion) -> list[EncodedLearner]:
        for learner in learners:            # one learner = one Triton request: it must fit the model's batch
            if learner.n_candidates > model.max_batch_size:
                raise errors.invalid_argument(f"{learner.prefix}candidates", f"at most {model.max_batch_size} "
                                              f"candidates for model {model.name!r} (its max_batch_size)")
        count = self._count_unknown
        return [encode_learner(learner, model.vocab, model.window, count) for learner in learners]

    def _count_unknown(self, kind: str, n: int) -> None:
        self.metrics.unknown_ids.labels(kind=kind).inc(n)

    async def _infer(self, model: ModelVersion, learners: list[EncodedLearner], deadline: Deadline) -> list[np.ndarray]:
        """P(correct) per candidate for each learner: float32 [C_i] each."""
        rows_limit = max(1, min(self.settings.max_rows_per_infer, model.max_batch_size))
        chunks: list[list[int]] = [[]]
        rows = 0
        for i, learner in enumerate(learners):                   # whole learners per request
            if chunks[-1] and rows + learner.n_candidates > rows_limit:
                chunks.append([])
                rows = 0
            chunks[-1].append(i)
            rows += learner.n_candidates
        windows = [build_windows(learner, model.window) for learner in learners]
        results = await asyncio.gather(*(self._infer_chunk(model, [windows[i] for i in chunk], deadline)
                                         for chunk in chunks))
        out: list[np.ndarray] = []
        for chunk, probs in zip(chunks, results):
            offset = 0
            for i in chunk:
                n = learners[i].n_candidates
                out.append(np.asarray(probs[offset:offset + n, -1], dtype=np.float32))
                offset += n
        return out

    async def _infer_chunk(self, model: ModelVersion, windows: list[tuple[np.ndarray, ...]],
                           deadline: Deadline) -> np.ndarray:
        questions, skills, responses = (np.concatenate([w[k] for w in windows]) for k in range(3))
        timeout = deadline.remaining() - self.settings.deadline_margin_s
        if timeout <= 0:
            raise errors.deadline_exceeded("the deadline passed before the model was called")
        try:
            return await self.backend.infer(model.name, model.version, questions, skills, responses, timeout)
        except BackendError as exc:
            raise _client_error(exc, model) from None


def _client_error(exc: BackendError, model: ModelVersion) -> ServingError:
    """A safe client-facing error for a Triton failure (Triton's text stays in the log)."""
    if exc.kind is FailureKind.DEADLINE:
        return errors.deadline_exceeded("the deadline passed while the model was running")
    if exc.kind is FailureKind.STUB_CRASHED:
        return errors.unavailable(f"model {model.name!r} crashed and is being reloaded; retry shortly")
    if exc.kind is FailureKind.UNAVAILABLE:
        return errors.unavailable("the inference server is not available; retry shortly")
    if exc.kind is FailureKind.NOT_LOADED:
        return errors.unavailable(f"model {model.name!r} version {model.version} is not loaded; retry shortly")
    if exc.kind is FailureKind.REJECTED:
        log.error("Triton rejected the gateway's request for model %s version %s (a gateway bug)",
                  model.name, model.version)
        return errors.internal()
    return errors.unavailable(f"model {model.name!r} failed to run; retry shortly")


class KnowledgeTracingServicer(pb_grpc.KnowledgeTracingServiceServicer):
    """gRPC adapter: deadline from the call, ServingError -> status code + message + field."""

    def __init__(self, service: PredictionService) -> None:
        self.service = service

    async def Predict(self, request: pb.PredictRequest, context: grpc.aio.ServicerContext) -> pb.PredictResponse:
        try:
            return await self.service.predict(request, self._deadline(context))
        except ServingError as exc:
            await _abort(context, exc)
            raise AssertionError("unreachable") from None

    async def PredictBatch(self, request: pb.PredictBatchRequest,
                           context: grpc.aio.ServicerContext) -> pb.PredictBatchResponse:
        try:
            return await self.service.predict_batch(request, self._deadline(context))
        except ServingError as exc:
            await _abort(context, exc)
            raise AssertionError("unreachable") from None

    def _deadline(self, context: grpc.aio.ServicerContext) -> Deadline:
        remaining = context.time_remaining()
        return Deadline.after(self.service.settings.default_deadline_s if remaining is None else remaining)


async def _abort(context: grpc.aio.ServicerContext, exc: ServingError) -> None:
    if exc.field:
        context.set_trailing_metadata(((errors.FIELD_METADATA_KEY, exc.field),))
    await context.abort(exc.code, exc.message)
