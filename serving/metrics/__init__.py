"""Every Prometheus metric of the gateway, built on an injectable CollectorRegistry (each test builds
its own), declared in groups by concern (the `_declare_*` methods of Metrics). Beside it:
grpc_calls.py (the grpc_server_* family, counted by the handlers as they register), sink.py (the
pipeline's PredictionSink that counts served probabilities), quality.py (online quality per version).

Names: `grpc_server_started_total`, `grpc_server_handled_total` and `grpc_server_handling_seconds`
follow go-grpc-prometheus / the common gRPC dashboards (labels grpc_service, grpc_method, grpc_type
and grpc_code); the domain metrics are `routerkt_*` in base units (seconds, counts). Buckets suit
millisecond latencies. Labels never carry learner ids, only model names, codes and reasons.

Served by the gateway's HTTP port (serving/transport/http_routes.py) at /metrics. Triton's own metrics
stay on its metrics port; `TRITON_METRICS` lists the ones our Grafana dashboard reads from there.
"""
from __future__ import annotations

import functools

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from routerkt import build
from serving.metrics.grpc_calls import CountingRegistry
from serving.metrics.quality import OutcomeQuality

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0)
HISTORY_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
CANDIDATE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64)

# Metric names as exposed (counters with their _total suffix). The dashboard test checks against it.
METRIC_NAMES = (
    "grpc_server_started_total",
    "grpc_server_handled_total",
    "grpc_server_handling_seconds",
    "routerkt_triton_request_seconds",
    "routerkt_history_length",
    "routerkt_candidates_per_call",
    "routerkt_unknown_ids_total",
    "routerkt_errors_total",
    "routerkt_inflight_requests",
    "routerkt_queued_requests",
    "routerkt_model_reloads_total",
    "routerkt_model_ready",
    "routerkt_triton_ready",
    "routerkt_http_requests_total",
    "routerkt_predictions_total",
    "routerkt_build_info",
    "routerkt_store_seconds",
    "routerkt_store_errors_total",
    "routerkt_store_up",
    "routerkt_events_total",
    "routerkt_undecodable_requests_total",
    "routerkt_triton_restarts_total",
    "routerkt_outcomes_total",
    "routerkt_outcome_log_loss",          # a summary: _sum and _count
    "routerkt_outcome_brier",             # a summary: _sum and _count
    "routerkt_outcome_probability",
    "routerkt_outcome_correct_total",
    "routerkt_online_auc",
    "routerkt_online_ece",
    "routerkt_online_reliability",
    "routerkt_online_outcomes",
    "routerkt_served_dropped_total",
    "routerkt_outcome_join_errors_total",
    "routerkt_shadow_predictions_total",
    "routerkt_shadow_skipped_total",
    "routerkt_shadow_failures_total",
    "routerkt_rollout_policy_ok",
    "routerkt_rollout_policy_errors_total",
    "routerkt_rollout_weight",
    "routerkt_rollout_rollbacks_total",
    "routerkt_rollout_decisions_total",
    "routerkt_rollout_log_loss_difference",
    "routerkt_triton_replica_up",
    "routerkt_triton_replica_inferences_total",
    "routerkt_triton_replica_retries_total",
    "routerkt_auth_failures_total",
    "routerkt_state_lookups_total",
    "routerkt_state_fills_total",
    "routerkt_state_evictions_total",
    "routerkt_state_cache_bytes",
    "routerkt_state_cache_learners",
    "routerkt_step_batch_calls",
)

# Metrics read from Triton's own /metrics port (Triton 2.51; docs/operations.md, "Triton 2.51 facts"), plus the
# execution histogram and the held-state gauges our python-backend model.py registers there.
TRITON_METRICS = (
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
    "nv_inference_pending_request_count",
    "nv_inference_request_summary_us",
    "nv_inference_queue_summary_us",
    "nv_inference_compute_infer_summary_us",
    "nv_cpu_utilization",
    "nv_cpu_memory_total_bytes",
    "nv_cpu_memory_used_bytes",
    "routerkt_triton_model_exec_seconds",
    "routerkt_triton_held_states",
    "routerkt_triton_held_state_bytes",
)


class Metrics:
    """The metric objects, registered on `registry` (a fresh one when None), by concern: the calls of both
    transports, what the calls carried, the inference backend (Triton, its replicas), the session store,
    online outcomes, rollout (shadows, canaries), security and the build."""

    def __init__(self, registry: CollectorRegistry | None = None, outcome_window_s: float = 600.0) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._declare_calls(self.registry)
        self._declare_call_contents(self.registry)
        self._declare_backend(self.registry)
        self._declare_sessions(self.registry)
        self._declare_outcomes(self.registry, outcome_window_s)
        self._declare_rollout(self.registry)
        self._declare_security(self.registry)
        self._declare_build(self.registry)

    def counting(self, server) -> CountingRegistry:
        """What a service registers on instead of the grpc.aio `server`: its unary calls are counted."""
        return CountingRegistry(server, self)

    def _declare_calls(self, registry: CollectorRegistry) -> None:
        """The calls of both transports: gRPC's standard family, HTTP requests, errors, slots."""
        grpc_labels = ("grpc_service", "grpc_method", "grpc_type")
        self.grpc_started = Counter(
            "grpc_server_started", "RPCs started on the server.", grpc_labels, registry=registry)
        self.grpc_handled = Counter(
            "grpc_server_handled", "RPCs completed on the server, regardless of success or failure.",
            grpc_labels + ("grpc_code",), registry=registry)
        self.grpc_handling_seconds = Histogram(
            "grpc_server_handling_seconds", "Response latency of RPCs handled by the server, in seconds.",
            grpc_labels, buckets=LATENCY_BUCKETS, registry=registry)
        self.http_requests = Counter(
            "routerkt_http_requests", "HTTP requests to the gateway's HTTP port.", ("handler", "status"),
            registry=registry)
        self.errors = Counter(
            "routerkt_errors", "Calls that failed, every RPC and HTTP route (auth refusals included), by gRPC "
            "code: counted once per call where its transport answers it.",
            ("code",), registry=registry)
        self.undecodable = Counter(
            "routerkt_undecodable_requests", "gRPC request bodies that did not decode (answered INVALID_ARGUMENT).",
            ("method",), registry=registry)
        self.inflight = Gauge(
            "routerkt_inflight_requests", "Predict/PredictBatch calls being served now.", registry=registry)
        self.queued = Gauge(
            "routerkt_queued_requests", "Predict/PredictBatch calls waiting for a free slot (max_queued).",
            registry=registry)

    def _declare_call_contents(self, registry: CollectorRegistry) -> None:
        """What the calls carried and got: history lengths, candidates, unknown ids, probabilities served."""
        self.history_length = Histogram(
            "routerkt_history_length", "Interactions per learner received (before truncation to the window).",
            buckets=HISTORY_BUCKETS, registry=registry)
        self.candidates = Histogram(
            "routerkt_candidates_per_call", "Candidate questions per learner.",
            buckets=CANDIDATE_BUCKETS, registry=registry)
        self.unknown_ids = Counter(
            "routerkt_unknown_ids", "Ids missing from the model's vocabulary (questions mapped to the "
            "unknown id; skills likewise: -1, no recorded skill, or an id the version does not know).",
            ("kind",), registry=registry)
        for kind in ("question", "skill"):          # expose zeros before the first unknown id
            self.unknown_ids.labels(kind=kind)
        self.predictions = Counter(
            "routerkt_predictions", "Candidate probabilities returned, by model and version.",
            ("model", "version"), registry=registry)

    def _declare_backend(self, registry: CollectorRegistry) -> None:
        """The inference backend: Triton's round trips, readiness, reloads, restarts and replicas."""
        self.triton_seconds = Histogram(
            "routerkt_triton_request_seconds", "Round trip of one Triton inference request, in seconds.",
            ("model", "version"), buckets=LATENCY_BUCKETS, registry=registry)
        self.reloads = Counter(
            "routerkt_model_reloads", "Unload + load of a model through Triton's model-control API.",
            ("model", "reason"), registry=registry)
        self.model_ready = Gauge(
            "routerkt_model_ready", "1 when the model answers inferences (readiness probe), else 0.",
            ("model",), registry=registry)
        self.triton_ready = Gauge(
            "routerkt_triton_ready", "1 when Triton answers as ready, else 0.", registry=registry)
        self.triton_restarts = Counter(
            "routerkt_triton_restarts", "Restarts of the tritonserver `routerkt serve` started, after it died.",
            registry=registry)
        self.triton_replica_up = Gauge(
            "routerkt_triton_replica_up", "1 while the Triton replica (its index in --triton-url) serves at least "
            "one model, else 0 (only with several replicas).", ("replica",), registry=registry)
        self.triton_replica_inferences = Counter(
            "routerkt_triton_replica_inferences", "Inference requests sent to each Triton replica on the request "
            "path (readiness probes excluded; only with several replicas).", ("replica",), registry=registry)
        self.triton_replica_retries = Counter(
            "routerkt_triton_replica_retries", "Inferences retried once on another Triton replica, by the kind "
            "of the first failure (unavailable, stub_crashed, not_loaded).", ("reason",), registry=registry)

    def _declare_sessions(self, registry: CollectorRegistry) -> None:
        """The session store: call latencies, failures, its health, and the events observed."""
        self.store_seconds = Histogram(
            "routerkt_store_seconds", "Session store calls, by operation (append, history, history_since, forget), in seconds.",
            ("operation",), buckets=LATENCY_BUCKETS, registry=registry)
        self.store_errors = Counter(
            "routerkt_store_errors", "Session store calls that failed or timed out, by operation.",
            ("operation",), registry=registry)
        self.store_up = Gauge(
            "routerkt_store_up", "1 while the session store answers, else 0.", registry=registry)
        self.events = Counter(
            "routerkt_events", "Observed events: stored, or skipped as duplicates of a stored event id.",
            ("result",), registry=registry)
        for result in ("stored", "duplicate"):
            self.events.labels(result=result)
        self.state_lookups = Counter(
            "routerkt_state_lookups", "Predicts answered by the learner-state path (serving/state/), by key (learner: "
            "by learner_id; history: the prefix cache of stateless Predicts) and the cached state found: hit, "
            "appended (new answers appended), miss (none), stale (rebuilt), lost (Triton no longer held the state: "
            "answered again from the whole history).",
            ("model", "key", "result"), registry=registry)
        self.state_fills = Counter(
            "routerkt_state_fills", "Cached learner states advanced by an Observe's new answers in the background: "
            "filled, dropped (window slid or too many answers), superseded (a Predict replaced it), lost (Triton no "
            "longer held it), skipped (too many fills running), failed.", ("model", "result"), registry=registry)
        self.state_evictions = Counter(
            "routerkt_state_evictions", "Cached learner states evicted to stay within --state-cache-mb.",
            ("model",), registry=registry)
        self.state_cache_bytes = Gauge(
            "routerkt_state_cache_bytes", "Bytes of learner states cached (at most --state-cache-mb).",
            registry=registry)
        self.state_cache_learners = Gauge(
            "routerkt_state_cache_learners", "Cached learner states (one per learner and model version).",
            registry=registry)
        self.step_batch_calls = Histogram(
            "routerkt_step_batch_calls", "Step-graph calls of concurrent Predicts merged into one backend call "
            "(step batching: step_batch_rows, step_gather_s); 1: a call that went alone.", ("model",),
            buckets=BATCH_BUCKETS, registry=registry)

    def _declare_outcomes(self, registry: CollectorRegistry, outcome_window_s: float) -> None:
        """Served predictions joined with answers: online quality per version (quality.py) and the joins' losses."""
        self.quality = OutcomeQuality(registry, outcome_window_s)
        self.served_dropped = Counter(
            "routerkt_served_dropped", "Served predictions not remembered for outcome tracking (the write "
            "queue was full, or the store failed).", registry=registry)
        self.outcome_join_errors = Counter(
            "routerkt_outcome_join_errors", "Observe / ReportOutcome calls whose join with served predictions "
            "failed (the store did not answer); the events themselves were stored.", registry=registry)

    def _declare_rollout(self, registry: CollectorRegistry) -> None:
        """Which version answers: shadow scorings, the policy file, canary weights and decisions."""
        self.shadow_predictions = Counter(
            "routerkt_shadow_predictions", "Candidate probabilities computed by a shadow version (never returned).",
            ("model", "version"), registry=registry)
        self.shadow_skipped = Counter(
            "routerkt_shadow_skipped", "Learners not shadow-scored because max_shadow_inflight were running.",
            ("model",), registry=registry)
        self.shadow_failures = Counter(
            "routerkt_shadow_failures", "Shadow scorings that failed (the caller's answer was not affected).",
            ("model",), registry=registry)
        self.rollout_policy_ok = Gauge(
            "routerkt_rollout_policy_ok", "1 when the rollout policy file in force is the file's current "
            "content; 0 when the file is malformed (the last good policy stays in force).", registry=registry)
        self.rollout_policy_ok.set(1)
        self.rollout_policy_errors = Counter(
            "routerkt_rollout_policy_errors", "Rollout policy file changes rejected as malformed.", registry=registry)
        self.rollout_weight = Gauge(
            "routerkt_rollout_weight", "Share of learners a canary actually sends to its candidate version: the "
            "policy's weight, 1 while its baseline does not answer, 0 while the candidate does not.",
            ("model",), registry=registry)
        self.rollout_rollbacks = Counter(
            "routerkt_rollout_rollbacks", "Canaries rolled back by the guardrail.", ("model",), registry=registry)
        self.rollout_decisions = Counter(
            "routerkt_rollout_decisions", "Canaries promoted or rolled back by the sequential test.",
            ("model", "decision"), registry=registry)
        self.rollout_difference = Gauge(
            "routerkt_rollout_log_loss_difference", "The sequential test's confidence sequence for candidate - "
            "baseline mean clipped log loss of a running canary (bound: lower, upper).", ("model", "bound"),
            registry=registry)

    def _declare_security(self, registry: CollectorRegistry) -> None:
        """API key refusals (serving/security/)."""
        self.auth_failures = Counter(
            "routerkt_auth_failures", "Calls refused for their API key, by transport and reason (missing, "
            "malformed, invalid, denied: a key without the scope; limited: a failure over the per-peer / "
            "per-key-id limit).", ("transport", "reason"), registry=registry)

    def _declare_build(self, registry: CollectorRegistry) -> None:
        """Which build of the gateway runs."""
        self.build_info = Gauge(
            "routerkt_build_info", "Always 1; the labels say which build of the gateway runs.",
            ("version", "git_sha"), registry=registry)
        self.build_info.labels(version=build.version(), git_sha=_git_sha()).set(1)


def labelled(metric):
    """`metric.labels`, each child looked up once (0.2 us a call against 1.7 us): for the metrics a call updates,
    whose label values are few (models, versions, operations, replicas) and whose children are never removed."""
    return functools.lru_cache(maxsize=None)(metric.labels)


@functools.lru_cache(maxsize=1)
def _git_sha() -> str:
    """The checkout's commit, read once per process (two git calls; every Metrics() would repeat them)."""
    return build.git_sha()
