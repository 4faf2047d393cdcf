"""Settings of the gateway: one frozen dataclass, every knob documented, validated in one place.

`routerkt serve` builds it from its --config file and flags (serving/cli/serve_config.py); tests
build it directly (ports 0 = any free port) and change it with dataclasses.replace.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, fields
from pathlib import Path

from routerkt.errors import UserError

MIB = 1 << 20
SERVICE_NAME = "routerkt.v1.KnowledgeTracingService"   # health-check service name (and the proto's)
SESSIONS_SERVICE_NAME = "routerkt.v1.Sessions"         # health-check name of the session store's state


@dataclass(frozen=True)
class Settings:
    """How the gateway listens, talks to Triton and protects itself. Frozen: a changed copy is
    dataclasses.replace(settings, ...).validate()."""

    # -- where things are ------------------------------------------------------------------------
    repository: Path = Path("model_repository")  # Triton model repository (vocab.json + model_info.json per version)
    backend: str = "triton"                       # the inference backend: a name of serving/backends BACKENDS
    triton_url: str = "127.0.0.1:8001"            # Triton's gRPC endpoint, HOST:PORT; several replicas:
                                                  # HOST:PORT,HOST:PORT,... (serving/backends/triton/replica_set.py)
    host: str = "127.0.0.1"                       # address the gateway binds (gRPC and HTTP)
    grpc_port: int = 50051                        # gateway gRPC port; 0 = any free port
    http_port: int | None = 8080                  # /metrics, /livez, /readyz, JSON mirror; 0 = any free, None = off

    # -- request limits (INVALID_ARGUMENT beyond them) ---------------------------------------------
    max_candidates: int = 64                      # candidates per learner (all go into ONE Triton inference)
    max_history: int = 10_000                     # interactions per learner accepted (only window-1 are used)
    max_batch_learners: int = 64                  # learners per PredictBatch call
    max_skills_per_interaction: int = 8           # skills in one interaction's / candidate's / event's set
    max_message_bytes: int = 4 * MIB              # gRPC max receive size; bigger messages get RESOURCE_EXHAUSTED
    rank_rows_per_infer: int = 1                  # learners per rank inference; a call sends its inferences one
                                                  # at a time, so large batches do not stall other callers
                                                  # (bench fairness: small p99 beside maximal batches 2.6x
                                                  # unloaded with 1, 3.8x with 4; docs/benchmarks.md)
    bulk_pause_ratio: float = 1.0                 # a call of several rank inferences yields a fair share: after
                                                  # each inference it waits this x its round trip x the other
                                                  # calls in flight (1: one turn each), shortened to fit its
                                                  # deadline. bench fairness --rounds 3, small p99 beside /
                                                  # alone: 1.50x with 1 vs 1.86x for a pause of one round trip
                                                  # (docs/benchmarks.md, "A maximal batch ...")
    rank_candidates_per_infer: int = 64           # candidates per rank inference: a learner with more is split
                                                  # into several (exact; the history is computed once per piece)
    http_body_timeout_s: float = 10.0            # an HTTP request body must arrive within this (408 otherwise)
    max_rows_per_infer: int = 256                 # rows per Triton request when packing a batch (capped by the
                                                  # model's max_batch_size); must be >= max_candidates

    # -- learner sessions (serving/sessions/) -------------------------------------------------------
    max_learner_id_chars: int = 128               # learner_id length accepted (INVALID_ARGUMENT beyond)
    max_event_id_chars: int = 128                 # event_id length accepted
    max_observe_events: int = 1000                # events per Observe call
    store_keep: int = 10000                       # events kept per learner: the newest max(store_keep, window); a band
                                                  # model is served on all of them (docs/operations.md)
    store_ttl_s: float = 0.0                      # learners inactive this long are deleted (0 = never)
    state_cache_mb: float = 256.0                 # learner states cached for Predict by learner_id on versions
                                                  # exported with step graphs (serving/state/); 0 = off
    prefix_cache: bool = False                    # stateless Predicts too, keyed by a hash of the history prefix
    held_states: bool = True                      # Triton keeps the states where the model's config allows it (a step
                                                  # call carries a key, not the state: serving/state/placement.py)
    fill_on_observe: bool = True                  # Observe advances the learner's cached states (in the background)
    step_batch_rows: int = 64                     # > 1: step calls of concurrent Predicts share one backend call of at
                                                  # most this many rows (serving/pipeline/step_batching.py)
    step_gather_s: float = 0.002                  # how long a batch waits for more calls at most (0: one loop turn;
                                                  # a lone call, the gateway serving no other, goes at once but for a
                                                  # probe at most every 0.25 s: step_batching.py)
    store_probe_s: float = 1.0                    # how often the store is pinged (health, recovery)
    store_expiry_s: float = 60.0                  # how often inactive learners are swept (SQLite)

    # -- outcome tracking and rollout (serving/outcomes/, serving/rollout/) --------------------------
    track_outcomes: bool = True                   # with a session store: remember what was served, join answers
    outcome_ttl_s: float = 3600.0                 # how long a served prediction waits for its answer
    outcome_window_s: float = 600.0               # rolling window of routerkt_online_auc / _ece / _reliability
    outcome_flush_s: float = 0.05                 # served predictions are written to the store in batches
                                                  # this often (off the request path)
    max_pending_served: int = 100_000             # served entries waiting for a write; beyond: dropped, counted
    rollout_policy: Path | None = None            # the rollout policy file (watched); None = latest everywhere
    rollout_poll_s: float = 1.0                   # how often the policy file is checked (and the guardrail run)
    rollout_load_timeout_s: float = 60.0          # a rollout change waits this long for a named version to load
    max_shadow_inflight: int = 4                  # shadow scorings running at once; beyond: skipped, counted

    # -- backpressure and deadlines ----------------------------------------------------------------
    max_inflight: int = 16                        # Predict/PredictBatch calls served at once; beyond:
                                                  # RESOURCE_EXHAUSTED. 16, not 64: at 128 callers goodput
                                                  # stayed 18.6 calls/s instead of 3.7 (docs/benchmarks.md
                                                  # "Overload"); ~ throughput x the latency one accepts
    max_call_rows: int = 16_384                   # cost of one call: learners x (window + candidates) rows;
                                                  # beyond: INVALID_ARGUMENT (split the call;
                                                  # serving/pipeline/admission.py)
    shed_min_inflight: int = 0                    # >0: with this many calls in flight, a call whose deadline is
                                                  # shorter than 1.5x its expected service time is refused
                                                  # (RESOURCE_EXHAUSTED); 0 = off (the default: not shown to
                                                  # raise goodput, docs/benchmarks.md)
    max_queued: int = 128                         # calls waiting for a slot at once; beyond: RESOURCE_EXHAUSTED at once
    inflight_wait_s: float = 1.0                  # longest wait for a slot (less when the call's deadline would not
                                                  # cover its expected service time after it; 0 = no queue).
                                                  # Waiting, not refusing: at 128 callers refused callers retrying
                                                  # at once cost the CPU that admitted calls need
                                                  # (docs/benchmarks.md "Overload")
    default_deadline_s: float = 5.0               # deadline applied when the caller sets none (HTTP: always,
                                                  # unless the X-Request-Timeout header says otherwise)
    deadline_margin_s: float = 0.005              # kept back from the caller's deadline so the gateway answers
                                                  # DEADLINE_EXCEEDED itself instead of being cancelled

    # -- lifecycle ---------------------------------------------------------------------------------
    grace_period_s: float = 10.0                  # SIGTERM: how long in-flight calls may drain before cancellation
    probe_interval_s: float = 2.0                 # readiness probe period (a tiny real inference per model)
    probe_timeout_s: float = 2.0                  # timeout of each probe call to Triton
    probe_failures_before_reload: int = 2         # consecutive failed probes of a READY model before a reload
    reload_timeout_s: float = 60.0                # unload + load of one model through Triton's model-control API
    reload_cooldown_s: float = 5.0                # at least this long between two reloads (or loads) of one model
    repository_poll_s: float = 0.5                # how often the model catalog rescans the repository (a stat
                                                  # of 3 files per version: cheap; a new version is found fast)
    manage_models: bool = True                    # ask Triton (explicit mode) to load repository models/versions
                                                  # it does not serve yet

    # -- security (serving/security/, docs/security.md) ---------------------------------------------
    tls_cert: Path | None = None                  # PEM certificate (chain) of both ports; None = plaintext
    tls_key: Path | None = None                   # its private key; both files are re-read when they change
    tls_client_ca: Path | None = None             # set: clients must present a certificate it signed (mTLS)
    api_keys: Path | None = None                  # the API keys file (hashes + scopes); None = no authentication
    insecure: bool = False                        # allow a non-loopback host without TLS or keys (logged)
    triton_key_file: Path | None = None           # file holding "<header>=<key>" sent on Triton's model-control
                                                  # calls (its --grpc-restricted-protocol); None = none sent
    triton_tls_ca: Path | None = None             # set: the gateway talks TLS to every Triton URL and verifies
                                                  # its certificate against this CA (PEM)
    triton_tls_cert: Path | None = None           # the gateway's client certificate for Triton's mutual TLS
    triton_tls_key: Path | None = None            # ... and its key (both or neither; they turn TLS on too,
                                                  # verified against the system roots without triton_tls_ca)
    max_deadline_s: float = 300.0                 # a caller's deadline beyond this is capped to it (never expired)
    auth_failure_burst: int = 20                  # failed authentications a peer address (and a key id) may make
                                                  # at once before further failures answer RESOURCE_EXHAUSTED
                                                  # (429); 0 = no limit. Valid keys never wait (failures.py)
    auth_failure_per_s: float = 1.0               # ... refilled at this many a second
    trusted_proxies: tuple[str, ...] = ()         # IP addresses / CIDR networks of reverse proxies whose
                                                  # X-Forwarded-For names the HTTP client; () = none: the
                                                  # connection's own address is the client's (limit, logs)

    def __post_init__(self) -> None:
        """Normalise the forms a caller may pass: a str for a Path field, "A,B" or a list for
        trusted_proxies (spaces around items dropped). Checking is validate()'s."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("Path", "Path | None") and value is not None and not isinstance(value, Path):
                object.__setattr__(self, f.name, Path(value))
        object.__setattr__(self, "trusted_proxies", _proxy_items(self.trusted_proxies))

    def validate(self) -> "Settings":
        """Raise UserError naming the first bad field; returns self (normalised at construction)."""
        if (self.tls_cert is None) != (self.tls_key is None) or (self.tls_client_ca and not self.tls_cert):
            raise UserError("--tls-cert and --tls-key go together (and --tls-client-ca needs them)")
        if (self.triton_tls_cert is None) != (self.triton_tls_key is None):
            raise UserError("--triton-tls-cert and --triton-tls-key go together")
        for name in ("grpc_port", "http_port"):
            value = getattr(self, name)
            if value is None and name == "http_port":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 65535:
                raise UserError(f"settings.{name} must be a port number in [0, 65535], got {value!r}")
        positive_ints = ("max_candidates", "max_history", "max_batch_learners", "max_message_bytes",
                         "max_rows_per_infer", "max_inflight", "probe_failures_before_reload", "max_learner_id_chars",
                         "max_event_id_chars", "max_observe_events", "store_keep", "rank_rows_per_infer",
                         "rank_candidates_per_infer", "max_pending_served", "max_shadow_inflight", "max_call_rows",
                         "max_skills_per_interaction", "step_batch_rows")
        for name in positive_ints:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserError(f"settings.{name} must be a positive integer, got {value!r}")
        positive_floats = ("auth_failure_per_s", "default_deadline_s", "max_deadline_s", "probe_interval_s",
                           "probe_timeout_s", "reload_timeout_s", "repository_poll_s", "store_probe_s",
                           "store_expiry_s", "http_body_timeout_s", "outcome_ttl_s", "outcome_window_s",
                           "outcome_flush_s", "rollout_poll_s", "rollout_load_timeout_s")
        for name in positive_floats:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise UserError(f"settings.{name} must be a positive number of seconds, got {value!r}")
        if not isinstance(self.bulk_pause_ratio, (int, float)) or isinstance(self.bulk_pause_ratio, bool) \
                or not self.bulk_pause_ratio >= 0:
            raise UserError(f"settings.bulk_pause_ratio must be a number >= 0, got {self.bulk_pause_ratio!r}")
        for name in ("inflight_wait_s", "deadline_margin_s", "grace_period_s", "reload_cooldown_s", "store_ttl_s",
                     "step_gather_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise UserError(f"settings.{name} must be >= 0 seconds, got {value!r}")
        if self.step_gather_s > 0.1:
            raise UserError(f"settings.step_gather_s must be at most 0.1 s (a batch's wait adds to its calls' latency), "
                            f"got {self.step_gather_s!r}")
        if not isinstance(self.state_cache_mb, (int, float)) or isinstance(self.state_cache_mb, bool) \
                or not self.state_cache_mb >= 0:
            raise UserError(f"settings.state_cache_mb must be a number of MiB >= 0, got {self.state_cache_mb!r}")
        for name in ("shed_min_inflight", "max_queued", "auth_failure_burst"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UserError(f"settings.{name} must be an integer >= 0, got {value!r}")
        if self.max_rows_per_infer < self.max_candidates:
            raise UserError(f"settings.max_rows_per_infer ({self.max_rows_per_infer}) must be >= max_candidates "
                            f"({self.max_candidates}): one learner's candidates go into one inference")
        urls = self.triton_urls
        if not urls or len(set(urls)) != len(urls) or not all(_host_port(url) for url in urls):
            raise UserError("settings.triton_url must be HOST:PORT or a comma-separated list of distinct "
                            f"HOST:PORT, got {self.triton_url!r}")
        if not self.host:
            raise UserError("settings.host must not be empty")
        _check_proxies(self.trusted_proxies)
        return self

    @property
    def triton_urls(self) -> list[str]:
        """The Triton endpoints of `triton_url` (comma-separated, spaces around them ignored): one
        per replica, in order (the replica index in metrics and /readyz is the position here)."""
        return [url.strip() for url in (self.triton_url or "").split(",")]

    @property
    def forwarded_allow_ips(self) -> list[str]:
        """trusted_proxies for uvicorn, each IPv4 one also as IPv4-mapped IPv6 (::ffff:a.b.c.d: how a
        dual-stack socket, a wildcard --host, names an IPv4 client)."""
        out = []
        for text in self.trusted_proxies:
            network = ipaddress.ip_network(text)
            out.append(text)
            if network.version == 4:
                mapped = ipaddress.IPv6Address(f"::ffff:{network.network_address}")
                out.append(f"{mapped}/{96 + network.prefixlen}" if "/" in text else str(mapped))
        return out

    def describe(self) -> dict[str, object]:
        """The settings as plain values (logged once at start; holds no secrets)."""
        return {f.name: (str(v) if isinstance(v := getattr(self, f.name), Path) else v) for f in fields(self)}


def _proxy_items(value: object) -> object:
    """trusted_proxies as a tuple of stripped items (a comma-separated string is split); anything
    else is left for _check_proxies to refuse."""
    if isinstance(value, str):
        value = value.split(",") if value.strip() else ()
    if isinstance(value, (tuple, list)):
        return tuple(item.strip() if isinstance(item, str) else item for item in value)
    return value


def _check_proxies(value: object) -> None:
    """UserError for anything but IP addresses and CIDR networks (uvicorn would take other text as a
    literal that never matches)."""
    if not isinstance(value, tuple):
        raise UserError(f"--trusted-proxies must be IP addresses or CIDR networks, got {value!r}")
    for text in value:
        try:
            ipaddress.ip_network(text) if "/" in text else ipaddress.ip_address(text)
        except (TypeError, ValueError):
            raise UserError(f"--trusted-proxies: {text!r} is not an IP address or a CIDR network "
                            "(e.g. 10.0.0.7 or 10.0.0.0/8, no host bits after the /)") from None


def _host_port(url: str) -> bool:
    """HOST:PORT with a non-empty host and a port in [1, 65535]."""
    host, sep, port = url.rpartition(":")
    return bool(sep and host.strip() and port.isdigit() and 1 <= int(port) <= 65535)
