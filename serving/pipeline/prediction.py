"""PredictionService: the serving pipeline, as public steps that Predict, Recommend, Mastery and explain compose.

It knows no transport: gRPC and HTTP (serving/transport/) hand it a PredictQuery and render its
PredictResult or ServingError. The steps, in the order a query takes them: `call` (an in-flight
slot; errors counted and made client-safe) -> validation (serving/core/validation.py) -> `resolve` (the
catalog's versions, the version policy's Route per learner: a canary may split a batch, each
version's group runs on its own) -> admission (serving/pipeline/admission.py, Predict only) ->
`complete_history` (the request's history or the session store's) -> `encode` (ids -> left-padded
windows) -> `infer` / `infer_outputs` (the backend, within the caller's deadline; for a Predict's
learners named by learner_id, the learner-state path of serving/state/ when the backend runs the
version's step graphs) -> the prediction sink (Predict only). Learners whose route names a shadow version are
scored again by it in the background, after the answer (serving/pipeline/shadow.py); shadow answers go to the
sink only. With `issue_prediction_ids`, each learner not named by learner_id gets a prediction_id. Every failure
a client sees is a ServingError with a safe message (`client_error` for backend failures): tracebacks and
backend texts go to the log only, and nothing about a learner is logged.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from contextlib import asynccontextmanager
from typing import AsyncIterator, Awaitable, Callable, Sequence, TypeVar

import numpy as np

from serving import status_errors as errors
from serving.pipeline.admission import ServiceTime, call_rows, check_budget
from serving.core.catalog import ModelCatalog, ModelVersion
from serving.status_errors import ServingError, shown
from serving.core.encoded import EncodedLearner
from serving.metrics import Metrics, labelled
from serving.pipeline.parts import (Answer, BackendError, Encoder, FailureKind, HistorySource, InferenceBackend,
                           PredictionRecord, PredictionSink, Route, VersionPolicy)
from serving.core.calls import Deadline, LearnerPrediction, PredictQuery, PredictResult
from serving.settings import Settings
from serving.pipeline.shadow import ShadowScoring
from serving.pipeline.step_batching import StepBatcher
from serving.pipeline.versions import VersionResolver
from serving.state.cache import StateCache
from serving.state.learner_states import NONE, LearnerStates, StepCall
from serving.state.placement import StateLost
from serving.core.validation import LearnerInput, validate_query

log = logging.getLogger("routerkt.gateway.service")

T = TypeVar("T")


class PredictionService:
    """Transport-independent Predict / PredictBatch over injected parts."""

    def __init__(self, settings: Settings, catalog: ModelCatalog, backend: InferenceBackend, metrics: Metrics, *,
                 history: HistorySource, policy: VersionPolicy, encoder: Encoder, sink: PredictionSink,
                 issue_prediction_ids: bool = False, states: LearnerStates | None = None) -> None:
        self.settings = settings
        self.catalog = catalog
        self.backend = backend
        self.metrics = metrics
        self._batch_calls = labelled(metrics.step_batch_calls)
        self.history = history
        self.policy = policy
        self.versions = VersionResolver(catalog, backend, policy)
        self.encoder = encoder
        self.sink = sink
        self.issue_prediction_ids = issue_prediction_ids
        self.states = states                                  # the learner-state path (serving/state/), or None
        # a band model's history beyond W - 1 goes through its step graphs, uncached without a state cache
        self._band_steps = states or LearnerStates(StateCache(0), encoder)
        self.step_batcher = StepBatcher(settings.step_batch_rows, settings.step_gather_s, lambda: self._inflight,
                                        (StateLost,), on_batch=self._batched) if settings.step_batch_rows > 1 else None
        self._slots = asyncio.Semaphore(settings.max_inflight)
        self._inflight = 0
        self._queued = 0                                     # calls waiting for a slot
        self.service_time = ServiceTime()
        self.shadows = ShadowScoring(settings, metrics, sink, self._answer_groups)

    def _batched(self, key: tuple, calls: int) -> None:
        self._batch_calls(model=key[0]).observe(calls)

    def runs_steps(self, model: ModelVersion) -> bool:
        """Whether `model` answers through its step graphs here (the one place this is decided: the
        learner-state path, Observe's fill and a band model's long histories ask it)."""
        return self.backend.steps(model)

    async def predict(self, query: PredictQuery, deadline: Deadline) -> PredictResult:
        async with self.call(deadline):
            learners = validate_query(query, self.settings)
            routes = await self.resolve(query.model, query.version, [learner.learner_id for learner in learners])
            rows = call_rows(learners, routes[0].primary)
            check_budget(rows, self.settings, query.batch)
            self.service_time.admit(rows, deadline.remaining(), self._inflight, self.settings)
            started = time.perf_counter()
            try:
                answers = await self._answer_groups(learners, [r.primary for r in routes], deadline)
            except ServingError as exc:
                if exc.code_name == "DEADLINE_EXCEEDED":          # out of time: a lower bound, still load
                    self.service_time.add(rows, time.perf_counter() - started)
                raise
            self.service_time.add(rows, time.perf_counter() - started)
            ids = [uuid.uuid4().hex if self.issue_prediction_ids and not learner.learner_id else ""
                   for learner in learners]
            served = {r.primary.version for r in routes}
            result = PredictResult(model=routes[0].primary.name, version=served.pop() if len(served) == 1 else 0,
                                   learners=[LearnerPrediction(p, used, r.primary.version, i, key)
                                             for (p, used, key), r, i in zip(answers, routes, ids)])
            self.sink.on_prediction(PredictionRecord(query=query, result=result))
            self.shadows.start(query, learners, routes, ids)
            return result

    async def _answer_groups(self, learners: list[LearnerInput], models: list[ModelVersion],
                             deadline: Deadline) -> list[Answer]:
        """An Answer per learner, each by its model; one group per version."""
        groups: dict[int, list[int]] = {}
        for i, model in enumerate(models):
            groups.setdefault(model.version, []).append(i)
        if len(groups) == 1:                          # one version (the usual case): no task to gather
            return await self._answer(models[0], learners, deadline)
        out: list[Answer | None] = [None] * len(learners)

        async def group(indices: list[int]) -> None:
            model = models[indices[0]]
            for i, answer in zip(indices, await self._answer(model, [learners[i] for i in indices], deadline)):
                out[i] = answer
        await asyncio.gather(*(group(indices) for indices in groups.values()))
        return out  # type: ignore[return-value]

    async def _answer(self, model: ModelVersion, learners: list[LearnerInput], deadline: Deadline) -> list[Answer]:
        """An Answer per learner; once more from whole histories when the backend had lost a held state
        (StateLost: the entries are dropped by then, so the second try rebuilds them)."""
        try:
            return await self._answer_once(model, learners, deadline)
        except StateLost:
            self.metrics.state_lookups.labels(model=model.name, key="learner", result="lost").inc()
        try:
            return await self._answer_once(model, learners, deadline)
        except StateLost:
            raise errors.unavailable(f"model {shown(model.name)} lost a learner state twice; retry shortly") from None

    async def _answer_once(self, model: ModelVersion, learners: list[LearnerInput],
                           deadline: Deadline) -> list[Answer]:
        states = self.states if self.states is not None and self.runs_steps(model) else None
        learners = await self.complete_history(learners, model, deadline, states)
        self._observe_sizes(learners)
        encoded = self.encode(learners, model)
        probs = await self._infer_learners(model, learners, encoded, deadline, states)
        # a learner read after its cached state (LearnerInput.cached) used the state's interactions too
        return [(p, e.history_used + (0 if learner.cached is None else learner.cached.length), learner.learner_key)
                for p, e, learner in zip(probs, encoded, learners)]

    async def _infer_learners(self, model: ModelVersion, learners: list[LearnerInput], encoded: list[EncodedLearner],
                              deadline: Deadline, states: LearnerStates | None) -> list[np.ndarray]:
        """`infer`, except that learners named by learner_id (and, with the prefix cache, the others) take the
        learner-state path `states` (None: there is none, or the backend does not run `model`'s step graphs;
        the same probabilities, <= 1e-5)."""
        keys = [None] * len(learners) if states is None else [
            states.learner_keys_of(learner.learner_key) if learner.learner_key else None if learner.learner_id
            else states.history_keys(learner_encoded) if self.settings.prefix_cache else None
            for learner, learner_encoded in zip(learners, encoded)]
        named = [i for i, k in enumerate(keys) if k is not None]
        if not named:
            return await self.infer(model, encoded, deadline)
        rest = [i for i, k in enumerate(keys) if k is None]
        stepped = await states.predict(model, [keys[i] for i in named], [encoded[i] for i in named],
                                       self.step_runner(model, deadline), self._step_rows(model),
                                       self.settings.rank_candidates_per_infer,
                                       read=[(learners[i].cached, learners[i].revision) for i in named],
                                       held=self.holds_states(model))
        full = await self.infer(model, [encoded[i] for i in rest], deadline) if rest else []
        return _placed(len(learners), (named, stepped), (rest, full))

    def holds_states(self, model: ModelVersion) -> bool:
        """The backend keeps `model`'s learner states (serving/state/placement.py), and settings allow it."""
        return self.settings.held_states and self.backend.holds_states(model)

    def step_runner(self, model: ModelVersion, deadline: Deadline) -> StepCall:
        """(step graph, feeds) -> outputs: `model`'s step graphs through the backend, within `deadline`; calls of
        concurrent Predicts share one backend call (serving/pipeline/step_batching.py)."""
        async def step(timeout: float, graph: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            try:
                return await self.backend.infer_step(model, graph, feeds, timeout)
            except BackendError as exc:
                if exc.kind is FailureKind.STATE_LOST:
                    raise StateLost(exc.detail) from None
                raise

        async def send(graph: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return await self._backend_call(model, deadline, lambda timeout: step(timeout, graph, feeds))

        async def run(graph: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            if self.step_batcher is None:
                return await send(graph, feeds)
            return await self.step_batcher.run((model.name, model.version, graph), feeds,
                                               lambda merged: send(graph, merged), deadline.remaining())
        return run

    async def close(self) -> None:
        """Cancel shadow scorings still running (shutdown)."""
        await self.shadows.close()

    # -- the public steps --------------------------------------------------------------------------
    @asynccontextmanager
    async def call(self, deadline: Deadline) -> AsyncIterator[None]:
        """The frame of one query: an in-flight slot (RESOURCE_EXHAUSTED when none frees in time);
        anything raised inside that is not a ServingError is logged and answered INTERNAL (the last
        line of defence against leaking internals). Every other step runs inside it. Errors are
        counted once per call by the transport that answers it."""
        acquired = False
        try:
            await self._acquire(deadline)
            acquired = True
            self._inflight += 1
            self.metrics.inflight.inc()
            yield
        except (ServingError, asyncio.CancelledError, GeneratorExit):
            raise
        except Exception:
            log.exception("unexpected error while serving a prediction")
            raise errors.internal() from None
        finally:
            if acquired:
                self._inflight -= 1
                self.metrics.inflight.dec()
                self._slots.release()

    async def resolve(self, name: str, version: int, learner_ids: Sequence[str]) -> list[Route]:
        """The Route of each learner (serving/pipeline/versions.py)."""
        return await self.versions.resolve(name, version, learner_ids)

    async def complete_history(self, learners: list[LearnerInput], model: ModelVersion, deadline: Deadline,
                               states: LearnerStates | None = None) -> list[LearnerInput]:
        """Each learner with its history for `model` from the history source (the request's, or the
        session store's for a learner_id; with `states`, only what was stored after a learner's cached state)."""
        if len(learners) == 1:                        # one learner: no task to gather
            return [await self.history.complete(learners[0], model, deadline, states)]
        return list(await asyncio.gather(*(self.history.complete(learner, model, deadline, states)
                                           for learner in learners)))

    def encode(self, learners: list[LearnerInput], model: ModelVersion) -> list[EncodedLearner]:
        """The learners as the model's inputs (ids -> left-padded windows); INVALID_ARGUMENT naming
        `candidates` for a learner with more candidates than the model's max_batch_size."""
        for learner in learners:            # one learner = one inference: it must fit the model's batch
            if learner.n_candidates > model.max_batch_size:
                raise errors.invalid_argument(f"{learner.prefix}candidates", f"at most {model.max_batch_size} "
                                              f"candidates for model {shown(model.name)} (its max_batch_size)")
        return [self.encoder.encode(learner, model) for learner in learners]

    async def infer(self, model: ModelVersion, learners: list[EncodedLearner], deadline: Deadline,
                     candidates_per_infer: int = 0) -> list[np.ndarray]:
        """P(correct) per candidate for each learner: float32 [C_i] each. Score graph: whole
        learners in calls of at most min(max_rows_per_infer, max_batch_size) rows, concurrently.
        Rank graph: at most rank_rows_per_infer learners (of at most rank_candidates_per_infer
        candidates: a learner with more is split, exactly) per call, ONE call in flight at a time, so
        a large PredictBatch queues one small inference at a time in Triton and the inferences of
        other callers get in between (fair sharing; its own latency is about the sum of its parts).
        `candidates_per_infer` (> 0) replaces rank_candidates_per_infer (Mastery: a vocabulary in one call)."""
        long = [i for i, learner in enumerate(learners) if model.band and learner.history_used > model.window - 1]
        if long:
            return await self._infer_band(model, learners, long, deadline, candidates_per_infer)
        rank = model.graph.name == "rank"
        limit = self.settings.rank_rows_per_infer if rank else self.settings.max_rows_per_infer
        pieces, owners = (self.encoder.split_candidates(learners, candidates_per_infer or self.settings.rank_candidates_per_infer)
                          if rank
                          else (learners, list(range(len(learners)))))
        calls = self.encoder.inferences(pieces, model, max(1, min(limit, model.max_batch_size)))
        if rank:
            outputs = await self._infer_in_turn(model, calls, deadline)
        else:
            outputs = await asyncio.gather(*(self._infer_one(model, call.feeds, deadline) for call in calls))
        parts: list[list[np.ndarray]] = [[] for _ in learners]
        for call, output in zip(calls, outputs):          # calls and pieces keep the learners' order
            for i, probs in zip(call.learners, call.split(output)):
                parts[owners[i]].append(probs)
        out = [p[0] if len(p) == 1 else np.concatenate(p) for p in parts]
        return out  # type: ignore[return-value]

    async def _infer_band(self, model: ModelVersion, learners: list[EncodedLearner], long: list[int],
                          deadline: Deadline, candidates_per_infer: int) -> list[np.ndarray]:
        """`infer` where the learners `long` have more than W - 1 interactions for a band model: those through
        its step graphs (rebuilt, not cached: stateless), the others as usual."""
        if not self.runs_steps(model):
            raise errors.failed_precondition(f"model {shown(model.name)} version {model.version} is a band model and "
                                             "this backend does not run its step graphs (needed beyond "
                                             f"{model.window - 1} answers)")
        stepped = await self._band_steps.predict(model, [NONE] * len(long), [learners[i] for i in long],
                                                 self.step_runner(model, deadline), self._step_rows(model),
                                                 candidates_per_infer or self.settings.rank_candidates_per_infer)
        short = [i for i in range(len(learners)) if i not in set(long)]
        rest = await self.infer(model, [learners[i] for i in short], deadline, candidates_per_infer) if short else []
        return _placed(len(learners), (long, stepped), (short, rest))

    def _step_rows(self, model: ModelVersion) -> int:
        """Learners per step-graph call."""
        return max(1, min(self.settings.rank_rows_per_infer, model.max_batch_size))

    async def infer_outputs(self, model: ModelVersion, learner: EncodedLearner, outputs: tuple[str, ...],
                            deadline: Deadline) -> dict[str, np.ndarray]:
        """The named `outputs` of `model`'s graph for one encoded learner, in one backend call within
        the deadline (explain: the explain graph's outputs); backend failures as `client_error`."""
        if model.band and learner.history_used > model.window - 1:
            raise errors.failed_precondition(f"model {shown(model.name)} is a band model: its explanations cover "
                                             f"histories of at most {model.window - 1} answers, this one has "
                                             f"{learner.history_used}")
        feeds = self.encoder.inferences([learner], model, 1)[0].feeds
        return await self._backend_call(model, deadline, lambda timeout: self.backend.infer_outputs(
            model, feeds, outputs, timeout))

    # -- inside the steps ----------------------------------------------------------------------------
    async def _acquire(self, deadline: Deadline) -> None:
        """A slot among settings.max_inflight. With none free the call queues (at most max_queued
        waiting) for as long as inflight_wait_s allows and its deadline still covers a typical
        call's service time after the wait; otherwise RESOURCE_EXHAUSTED, at once or when the wait ends."""
        if not self._slots.locked():
            await self._slots.acquire()                      # free slot: returns without suspending
            return
        busy = f"the gateway is serving its maximum of {self.settings.max_inflight} calls"
        wait = min(self.settings.inflight_wait_s, deadline.remaining() - self.service_time.expected_call())
        if wait <= 0 or self._queued >= self.settings.max_queued:
            reason = ("it queues no calls" if self.settings.inflight_wait_s <= 0 else "its queue is full"
                      if wait > 0 else "this call's deadline leaves no time to queue")
            raise errors.resource_exhausted(f"{busy} and {reason}; retry with backoff")
        self._queued += 1
        self.metrics.queued.inc()
        try:
            await asyncio.wait_for(self._slots.acquire(), wait)
        except asyncio.TimeoutError:
            raise errors.resource_exhausted(f"{busy}; no slot freed within {wait * 1000:.0f} ms; "
                                            "retry with backoff") from None
        finally:
            self._queued -= 1
            self.metrics.queued.dec()

    def _observe_sizes(self, learners: list[LearnerInput]) -> None:
        for learner in learners:
            self.metrics.history_length.observe(learner.history_length + (0 if learner.cached is None else
                                                                          learner.cached.length))
            self.metrics.candidates.observe(learner.n_candidates)

    async def _infer_in_turn(self, model: ModelVersion, calls: list, deadline: Deadline) -> list[np.ndarray]:
        """The inferences one after the other, yielding a fair share of the model to the other calls
        in flight: after each inference the next one waits settings.bulk_pause_ratio x the previous
        round trip x the number of other calls in flight (one turn each for them per turn of this
        call, at ratio 1), shortened so that the rest still fits the deadline at that pace."""
        ratio, outputs = self.settings.bulk_pause_ratio, []
        for index, call in enumerate(calls):
            started = time.perf_counter()
            outputs.append(await self._infer_one(model, call.feeds, deadline))
            left, others = len(calls) - index - 1, self._inflight - 1
            if ratio > 0 and left and others > 0:
                trip = time.perf_counter() - started
                room = (deadline.remaining() - self.settings.deadline_margin_s) / left - trip
                pause = min(trip * ratio * others, room)
                if pause > 0:
                    await asyncio.sleep(pause)
        return outputs

    async def _infer_one(self, model: ModelVersion, feeds: dict[str, np.ndarray], deadline: Deadline) -> np.ndarray:
        return await self._backend_call(model, deadline, lambda timeout: self.backend.infer(model, feeds, timeout))

    async def _backend_call(self, model: ModelVersion, deadline: Deadline,
                            send: Callable[[float], Awaitable[T]]) -> T:
        """`send(timeout)` with what is left of the deadline less deadline_margin_s (DEADLINE_EXCEEDED
        when nothing is); a BackendError becomes its `client_error`."""
        timeout = deadline.remaining() - self.settings.deadline_margin_s
        if timeout <= 0:
            raise errors.deadline_exceeded("the deadline passed before the model was called")
        try:
            return await send(timeout)
        except BackendError as exc:
            raise client_error(exc, model) from None


def _placed(n: int, *groups: tuple[list[int], Sequence[np.ndarray]]) -> list[np.ndarray]:
    """The results of groups of learners (each group: their indices, their results) in the learners' order."""
    out: list[np.ndarray] = [np.empty(0, np.float32)] * n
    for indices, results in groups:
        for i, probs in zip(indices, results):
            out[i] = probs
    return out


def client_error(exc: BackendError, model: ModelVersion) -> ServingError:
    """The safe client-facing error for a backend failure of `model`, the same whatever the backend
    (its FailureKind decides; the backend's text stays in the log)."""
    name = shown(model.name)
    if exc.kind is FailureKind.DEADLINE:
        return errors.deadline_exceeded("the deadline passed while the model was running")
    if exc.kind is FailureKind.STUB_CRASHED:
        return errors.unavailable(f"model {name} crashed and is being reloaded; retry shortly")
    if exc.kind is FailureKind.UNAVAILABLE:
        return errors.unavailable("the inference server is not available; retry shortly")
    if exc.kind is FailureKind.NOT_LOADED:
        return errors.unavailable(f"model {name} version {model.version} is not loaded; retry shortly")
    if exc.kind is FailureKind.REJECTED:
        log.error("the backend rejected the gateway's request for model %s version %s (a gateway bug)",
                  model.name, model.version)
        return errors.internal()
    return errors.unavailable(f"model {name} failed to run; retry shortly")
