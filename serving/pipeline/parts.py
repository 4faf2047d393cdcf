"""The injected parts of the serving pipeline (serving/pipeline/prediction.py), each behind a small interface:

    query --validate--> HistorySource --> VersionPolicy --> Encoder --> InferenceBackend --> PredictionSink
          (validation)  where the history  which version   ids ->        P(correct) per     sees every
                        comes from         answers         model rows    row                prediction

Today's parts: RequestHistory (the request carries the history) or SessionHistory (the session
store's, when the request names the learner: serving/sessions/history.py), LatestReadyVersion (the
newest version the backend serves, or the one the request pins) or RolloutPolicy (a policy file's
rollout kind per model: serving/rollout/), WindowEncoder (serving/encoder/window.py),
TritonInferenceBackend or OnnxRuntimeBackend (serving/backends/), MetricsSink (serving/metrics/)
and OutcomeTracker (remembers what was served, for outcome tracking: serving/outcomes/).
`create_server(...)` (serving/server.py) takes any of them. A part with work of its own while the
gateway runs is a `Background` (maintain until cancelled, close at shutdown): the server runs
every one it is given, without knowing its type.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Mapping, Protocol

import numpy as np

from serving.core.encoded import StepFeeds

if TYPE_CHECKING:
    from serving.core.catalog import ModelCatalog, ModelVersion
    from serving.core.encoded import EncodedLearner, Inference
    from serving.core.calls import Deadline, PredictQuery, PredictResult
    from serving.core.revision import Revision
    from serving.core.validation import LearnerInput

Answer = tuple[np.ndarray, int, str]      # a learner's probabilities, history_used, learner key ("" unnamed)


class FailureKind(str, Enum):
    """Why an inference failed, independent of the backend that ran it."""

    UNAVAILABLE = "unavailable"      # the inference server is unreachable (down, restarting)
    NOT_LOADED = "not_loaded"        # the backend does not serve that model / version
    STUB_CRASHED = "stub_crashed"    # the process running the model died
    DEADLINE = "deadline"            # the timeout passed
    REJECTED = "rejected"            # the backend refused our tensors: a gateway bug
    FAILED = "failed"                # the model failed while executing
    STATE_LOST = "state_lost"        # the backend no longer holds a learner state the call named (rebuild it)


class BackendError(Exception):
    """An inference failed; `detail` is the backend's own text, for the log only."""

    def __init__(self, kind: FailureKind, detail: str) -> None:
        super().__init__(f"{kind.value}: {detail}")
        self.kind = kind
        self.detail = detail


class CachedState(Protocol):
    """A learner-state cache entry as a history source sees it (serving/state/cache.py's LearnerState)."""

    revision: Revision | None        # the store's log it was computed at (None: unknown)

    @property
    def length(self) -> int: ...     # the interactions it covers


class StateLookup(Protocol):
    """The learner-state cache, asked by a history source before it reads the store (serving/state/)."""

    max_appends: int

    def cached(self, model: ModelVersion, learner_key: str) -> CachedState | None: ...

    async def settled(self, learner_key: str, wait_s: float) -> None:
        """Return once no Observe's fill of the learner is running (at most `wait_s`)."""


class HistorySource(Protocol):
    """Where a learner's history comes from."""

    async def complete(self, learner: LearnerInput, model: ModelVersion, deadline: Deadline,
                       states: StateLookup | None = None) -> LearnerInput:
        """The learner with its history filled in for `model` (may return `learner` itself). With `states`,
        a named learner whose cached state the store's log still continues gets only the events stored
        after that state (`LearnerInput.cached` set), found with one small read."""


@dataclass(frozen=True)
class Route:
    """The version that answers a learner, and the one that also scores it in the background."""

    primary: ModelVersion
    shadow: ModelVersion | None = None


class Background(Protocol):
    """A part with background work: the gateway runs `maintain` from start until shutdown, then `close`."""

    async def maintain(self) -> None:
        """Upkeep until cancelled (returns at once when there is none)."""

    async def close(self) -> None: ...


class VersionPolicy(Protocol):
    """Which version of a model answers a learner (and its upkeep: a watched file, guardrails)."""

    async def maintain(self) -> None:
        """Upkeep until cancelled (returns at once when there is none)."""

    def status(self) -> dict[str, object]:
        """What is in force: {"file", "error", "models"} (GET /v1/rollout)."""

    async def change(self, model: str, value: object) -> dict[str, object]:
        """Set one model's policy entry (PUT /v1/rollout/{model}); its JSON as in force, or a ServingError."""

    def route(self, name: str, requested: int, versions: Mapping[int, ModelVersion], ready: frozenset[int],
              learner_id: str) -> Route:
        """A Route over `versions` (all in the catalog) given the ones the backend serves now
        (`requested` != 0: the caller pinned that version; `learner_id` may be "", never logged);
        raises a ServingError (UNAVAILABLE) when none can answer."""


class Encoder(StepFeeds, Protocol):
    """Raw platform ids -> the served graph's inputs, packed into backend calls."""

    def encode(self, learner: LearnerInput, model: ModelVersion) -> EncodedLearner: ...

    def inferences(self, learners: list[EncodedLearner], model: ModelVersion, rows_limit: int) -> list[Inference]:
        """Backend calls of at most `rows_limit` rows that together answer every learner."""

    # the learner-state path (serving/state/) encodes an Observe's answers and builds the step graphs'
    # feeds (StepFeeds) with the same Encoder, so that a custom one is used there too
    def encode_new(self, learner: LearnerInput, model: ModelVersion) -> EncodedLearner:
        """Newly stored answers (an Observe's) in model ids, not counted as a request's."""


class InferenceBackend(Protocol):
    """Runs model versions and knows which of them answer right now."""

    async def start(self, catalog: ModelCatalog) -> None:
        """Connect, and check readiness once (before the gateway reports SERVING)."""

    async def maintain(self, catalog: ModelCatalog) -> None:
        """Background upkeep (readiness probes, reloads) until cancelled."""

    def wake(self) -> None:
        """The catalog changed: look again soon."""

    async def close(self) -> None: ...

    @property
    def serving(self) -> bool:
        """The backend is up and at least one model answers."""

    def ready_versions(self, model: str) -> frozenset[int]: ...

    def ready_models(self) -> dict[str, list[int]]: ...

    async def ensure_ready(self, model: str, version: int, timeout_s: float) -> bool:
        """Load `version` (in the repository) when it does not answer; True once it answers, within timeout_s."""

    def unavailable_reason(self, model: str) -> str | None:
        """Why `model` cannot be served at all now (a client-safe sentence), or None."""

    def describe(self) -> dict[str, object]:
        """Readiness details for /readyz and the health log line."""

    async def infer(self, model: ModelVersion, feeds: dict[str, np.ndarray], timeout_s: float) -> np.ndarray:
        """The served graph's output for `feeds` (score: probs [rows, window]; rank: candidate_probs
        [rows, candidates]), float32; raises BackendError."""

    async def infer_outputs(self, model: ModelVersion, feeds: dict[str, np.ndarray], outputs: tuple[str, ...],
                            timeout_s: float) -> dict[str, np.ndarray]:
        """The named `outputs` for `feeds` in one call, float32 (the explain call, serving/queries/explain.py: the
        explain graph's outputs, signature.EXPLAIN, of a version the catalog marks `explain`); raises
        BackendError, as `infer` does."""

    def steps(self, model: ModelVersion) -> bool:
        """True when this backend runs `model`'s step graphs (infer_step): the learner-state path of
        serving/state/ may answer for it; False: the full forward answers every call."""

    def holds_states(self, model: ModelVersion) -> bool:
        """True when this backend keeps `model`'s learner states between step calls (the held graphs of
        routerkt/contract/step_signature.py; serving/state/placement.py): a call then carries a key."""

    async def infer_step(self, model: ModelVersion, graph: str, feeds: dict[str, np.ndarray],
                         timeout_s: float) -> dict[str, np.ndarray]:
        """Every output of `model`'s step graph `graph` (step_start | step_append | step_next, or a held_*
        graph where holds_states(), routerkt/contract/step_signature.py) for `feeds`, by output name; raises
        BackendError (REJECTED for a version whose steps() is False; STATE_LOST for a held key not held)."""


@dataclass(frozen=True)
class PredictionRecord:
    """One answered call (or its shadow scoring), as a sink sees it. The query holds the learner
    ids; a sink must not log them or use them as labels."""

    query: PredictQuery
    result: PredictResult
    shadow: bool = False             # True: scored by a shadow version, never returned


class PredictionSink(Protocol):
    """Sees every prediction the gateway returns (and every shadow scoring)."""

    def on_prediction(self, prediction: PredictionRecord) -> None: ...


class SinkChain:
    """Several sinks as one, called in order."""

    def __init__(self, *sinks: PredictionSink) -> None:
        self.sinks = sinks

    def on_prediction(self, prediction: PredictionRecord) -> None:
        for sink in self.sinks:
            sink.on_prediction(prediction)
