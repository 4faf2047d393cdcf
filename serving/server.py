"""The gateway process: gRPC server (KnowledgeTracingService, grpc.health.v1, reflection) plus the
HTTP app (serving/transport/http_api.py, uvicorn) on ONE asyncio event loop, the backend's upkeep (readiness
probes), the repository poller, the health updater, and graceful shutdown.

    server, port = create_server(settings)        # inside a running event loop; binds both ports
    server, port = create_server(settings, backend=OnnxRuntimeBackend(settings), history=...)  # other parts
    await server.start()                          # first repository scan + Triton probe, then serve
    ...
    await server.stop()                           # NOT_SERVING, drain (grace period), close

`serve(settings)` runs that until SIGTERM/SIGINT (what `routerkt serve` uses); `ThreadedGateway`
runs it on a private loop in a daemon thread, for synchronous programs (load tests, tests).

Health: the overall service "" and "routerkt.v1.KnowledgeTracingService" are SERVING only while
the backend is up and at least one model answers (for Triton: its probe); NOT_SERVING otherwise and from the start
of shutdown on. Shutdown order: health NOT_SERVING -> stop accepting (gRPC and HTTP) -> in-flight
calls drain for up to `grace_period_s`, then are cancelled -> background tasks and the Triton
client are closed.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
import threading
from concurrent.futures import Future
from typing import Any, Awaitable, Callable, Coroutine

import grpc
import uvicorn
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from routerkt.errors import UserError
from serving.api import knowledge_tracing_pb2 as pb
from serving.backends import BACKENDS
from serving.core.catalog import ModelCatalog
from serving.encoder.window import WindowEncoder
from serving.metrics import Metrics
from serving.metrics.sink import MetricsSink
from serving.outcomes.tracker import OutcomeTracker
from serving.pipeline.parts import (Background, Encoder, HistorySource, InferenceBackend, PredictionSink, SinkChain,
                                    VersionPolicy)
from serving.pipeline.prediction import PredictionService
from serving.queries.recommend import Recommender
from serving.rollout.kinds.latest import LatestReadyVersion
from serving.rollout.policy import RolloutPolicy
from serving.rollout.readiness import BackendReadiness
from serving.security.api_keys import KeyFile
from serving.security.exposure import refuse_exposure, warn_exposure
from serving.security.failures import AuthFailures
from serving.security.guard import Guard
from serving.security.tls import TlsFiles
from serving.sessions.history import RequestHistory, SessionHistory
from serving.sessions.keys import LearnerKeys
from serving.sessions.session_service import SessionService
from serving.sessions.store import SessionStore
from serving.sessions.store_calls import StoreCalls
from serving.state import learner_states
from serving.pipeline.state_fill import StateFill
from serving.settings import SERVICE_NAME, SESSIONS_SERVICE_NAME, Settings
from serving.transport.endpoints import Endpoints
from serving.transport.grpc_api import KnowledgeTracingServicer, add_to_server
from serving.transport.http_api import create_app

log = logging.getLogger("routerkt.gateway")

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
HEALTH_POLL_S = 0.1          # how often the health status follows the backend's readiness
STOP_STEP_S = 10.0           # every shutdown step beyond the grace period is bounded by this


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: the gateway owns SIGTERM/SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[override]
        yield


class GatewayServer:
    """Both servers of one gateway and the tasks around them (see the module docstring)."""

    def __init__(self, service: PredictionService, recommender: Recommender, sessions: SessionService | None = None,
                 background: tuple[Background, ...] = (), guard: Guard | None = None,
                 tls: TlsFiles | None = None) -> None:
        self.service = service
        self.recommender = recommender
        self.sessions = sessions
        self.policy = service.policy
        self.background = background          # parts with upkeep of their own (sessions, tracker, policy)
        self.endpoints = Endpoints(service, recommender, sessions, self.policy, self, guard or Guard())
        self.tls = tls                        # None: plaintext on both ports
        self.settings = settings = service.settings
        self.metrics = metrics = service.metrics
        self.catalog = service.catalog
        self.backend = service.backend
        self.health = health_aio.HealthServicer()
        self.grpc = grpc.aio.server(
            options=[("grpc.max_receive_message_length", settings.max_message_bytes),
                     ("grpc.max_send_message_length", settings.max_message_bytes),
                     ("grpc.so_reuseport", 0)])
        counting = metrics.counting(self.grpc)            # registers each service's unary calls counted
        add_to_server(KnowledgeTracingServicer(self.endpoints), counting)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, counting)
        reflection.enable_server_reflection(
            (pb.DESCRIPTOR.services_by_name["KnowledgeTracingService"].full_name,
             health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), self.grpc)
        address = f"{settings.host}:{settings.grpc_port}"
        try:
            self.grpc_port = (self.grpc.add_secure_port(address, tls.grpc_credentials()) if tls is not None
                              else self.grpc.add_insecure_port(address))
        except RuntimeError:
            self.grpc_port = 0
        if self.grpc_port == 0:
            raise UserError(f"cannot listen for gRPC on {address} (port in use?)")
        self._http_socket: socket.socket | None = None
        self._http: _EmbeddedUvicorn | None = None
        self.http_port: int | None = None
        if settings.http_port is not None:
            try:
                self._http_socket = _bind(settings.host, settings.http_port)
            except OSError as exc:
                raise UserError(f"cannot listen for HTTP on {settings.host}:{settings.http_port}: "
                                f"{exc.strerror}") from None
            self.http_port = self._http_socket.getsockname()[1]
        self._http_task: asyncio.Task | None = None
        self._tasks: list[asyncio.Task] = []               # probe and repository loops
        self._stopping = False
        self._serving: bool | None = None
        self._store_up: bool | None = None
        self._stopped = asyncio.Event()

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        """Scan the repository, probe Triton once, then start serving gRPC and HTTP."""
        log.info("gateway settings: %s", json.dumps(self.settings.describe(), sort_keys=True))
        warn_exposure(self.settings)                   # --insecure beyond loopback: at every start
        await asyncio.to_thread(self.catalog.refresh)
        await self.backend.start(self.catalog)
        if self.sessions is not None:                  # the store is probed once before SERVING
            await self.sessions.start()
        await self._update_health()
        await self.grpc.start()
        if self._http_socket is not None:
            app = create_app(self.endpoints)
            tls = self.tls
            proxies = self.settings.forwarded_allow_ips     # X-Forwarded-For from these only (none by default)
            config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off",
                                    proxy_headers=bool(proxies), forwarded_allow_ips=proxies or None,
                                    timeout_graceful_shutdown=max(1, int(self.settings.grace_period_s)),
                                    ssl_context_factory=None if tls is None else lambda config, default: tls.context)
            self._http = _EmbeddedUvicorn(config)
            self._http_task = asyncio.create_task(self._http.serve(sockets=[self._http_socket]))
        self._tasks.append(asyncio.create_task(self.backend.maintain(self.catalog)))
        self._tasks.append(asyncio.create_task(self._repository_loop()))
        self._tasks.append(asyncio.create_task(self._health_loop()))
        self._tasks.extend(asyncio.create_task(part.maintain()) for part in self.background)
        log.info("gateway started: gRPC %s:%d, HTTP %s, Triton %s, models %s", self.settings.host, self.grpc_port,
                 f"{self.settings.host}:{self.http_port}" if self.http_port else "off", self.settings.triton_url,
                 self.backend.ready_models() or "none ready yet")

    async def stop(self, grace: float | None = None) -> None:
        """Graceful shutdown (idempotent): NOT_SERVING, stop accepting, drain, close."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        grace = self.settings.grace_period_s if grace is None else grace
        log.info("gateway shutting down: draining in-flight calls for up to %.1fs", grace)
        await self.health.enter_graceful_shutdown()
        if self._http is not None:
            self._http.should_exit = True
        try:                                       # bounded even if a cancelled handler never finishes
            await asyncio.wait_for(self.grpc.stop(grace), grace + STOP_STEP_S)
        except asyncio.TimeoutError:
            log.warning("the gRPC server did not stop within %.1fs of its grace period", STOP_STEP_S)
        log.info("gateway: gRPC stopped")
        if self._http_task is not None:
            try:
                await asyncio.wait_for(self._http_task, grace + 5)
            except (asyncio.TimeoutError, Exception):
                log.warning("the HTTP server did not stop in time")
        elif self._http_socket is not None:
            self._http_socket.close()
        for task in self._tasks:
            task.cancel()
        closing = [asyncio.gather(*self._tasks, return_exceptions=True), self.service.close(),
                   *(part.close() for part in self.background), self.backend.close()]
        for step in closing:
            try:
                await asyncio.wait_for(step, STOP_STEP_S)
            except Exception as exc:               # a part that does not close in time must not hang the exit
                log.warning("gateway shutdown step did not finish cleanly: %s", type(exc).__name__)
        log.info("gateway stopped")
        self._stopped.set()

    @property
    def ready(self) -> bool:
        return not self._stopping and self.backend.serving

    @property
    def stopping(self) -> bool:
        return self._stopping

    # -- background ------------------------------------------------------------------------------
    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_POLL_S)
            try:
                await self._update_health()
            except Exception:                              # never let the loop die
                log.exception("updating the health status failed")

    async def _repository_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.repository_poll_s)
            try:
                result = await asyncio.to_thread(self.catalog.refresh)
            except Exception:
                log.exception("rescanning the model repository failed")
                continue
            if result.added or result.removed:
                log.info("model repository changed: added %s, removed %s", list(result.added), list(result.removed))
                self.backend.wake()

    async def _update_health(self) -> None:
        if self._stopping:
            return
        serving = self.backend.serving
        if serving != self._serving:
            log.info("health: %s (backend: %s, models ready: %s)", "SERVING" if serving else "NOT_SERVING",
                     self.backend.describe(), self.backend.ready_models())
            self._serving = serving
        status = SERVING if serving else NOT_SERVING
        await self.health.set("", status)
        await self.health.set(SERVICE_NAME, status)
        if self.sessions is not None and self.sessions.up != self._store_up:
            self._store_up = self.sessions.up
            await self.health.set(SESSIONS_SERVICE_NAME, SERVING if self.sessions.up else NOT_SERVING)


def create_server(settings: Settings, *, metrics: Metrics | None = None, catalog: ModelCatalog | None = None,
                  backend: InferenceBackend | None = None, history: HistorySource | None = None,
                  policy: VersionPolicy | None = None, encoder: Encoder | None = None,
                  sink: PredictionSink | None = None, store: SessionStore | None = None,
                  keys: LearnerKeys | None = None) -> tuple[GatewayServer, int]:
    """Build the gateway from its parts, each built once its own parts are (constructor injection, no
    part changed after it is made); defaults: the repository's catalog, Triton at settings.triton_url
    (several URLs: TritonReplicaBackend over them), the request's history, the policy file's versions
    (settings.rollout_policy) or else the latest ready version, window encoding, metrics, and with a
    session store (`store` + `keys`) and settings.track_outcomes, outcome tracking; bind its ports
    (call inside a running event loop). Returns the server (not started) and the bound gRPC port."""
    settings.validate()
    refuse_exposure(settings)
    tls = TlsFiles(settings.tls_cert, settings.tls_key, settings.tls_client_ca) if settings.tls_cert else None
    metrics = metrics or Metrics(outcome_window_s=settings.outcome_window_s)
    guard = Guard(KeyFile(settings.api_keys) if settings.api_keys is not None else None,
                  AuthFailures(metrics.auth_failures, settings.auth_failure_burst, settings.auth_failure_per_s))
    catalog = catalog or ModelCatalog(settings.repository)
    if store is not None and keys is None:
        raise ValueError("a session store needs the learner keys (keys=LearnerKeys(secret))")
    calls = StoreCalls(settings, store, metrics) if store is not None else None
    keys = keys if calls is not None else None
    history = history or (SessionHistory(calls, keys, settings.store_keep) if calls is not None else RequestHistory())
    if backend is None and settings.backend not in BACKENDS:
        raise UserError(f"settings.backend must be one of {sorted(BACKENDS)}, got {settings.backend!r}")
    backend = backend or BACKENDS[settings.backend].build(settings, metrics)
    if policy is None:
        readiness = BackendReadiness(catalog.versions, backend.ready_versions, backend.ensure_ready)
        policy = RolloutPolicy(settings.rollout_policy, metrics, keys, poll_s=settings.rollout_poll_s,
                               readiness=readiness, load_timeout_s=settings.rollout_load_timeout_s) \
            if settings.rollout_policy else LatestReadyVersion()
    tracker = OutcomeTracker(settings, store, keys, metrics) if calls is not None and settings.track_outcomes else None
    sink = sink or MetricsSink(metrics)
    encoder = encoder or WindowEncoder(lambda kind, n: metrics.unknown_ids.labels(kind=kind).inc(n))
    states = learner_states(settings, metrics, encoder) \
        if settings.state_cache_mb > 0 and (calls is not None or settings.prefix_cache) else None
    service = PredictionService(
        settings, catalog, backend,
        metrics, history=history, policy=policy,
        encoder=encoder,
        sink=SinkChain(sink, tracker) if tracker is not None else sink, issue_prediction_ids=tracker is not None,
        states=states)
    # ForgetLearner drops (Observe advances) cached states
    fill = StateFill(service, states, metrics, settings.fill_on_observe) \
        if states is not None and calls is not None else None
    sessions = SessionService(settings, calls, keys, catalog, metrics, tracker=tracker, states=fill) \
        if calls is not None else None
    # closed in this order at shutdown: the tracker flushes into the store before the store closes
    background: tuple[Background, ...] = tuple(part for part in (fill, tracker, policy, calls, tls)
                                               if part is not None)
    server = GatewayServer(service, Recommender(service, sessions), sessions, background, guard, tls)
    return server, server.grpc_port


async def serve(settings: Settings, on_started: Callable[[GatewayServer], Awaitable[None]] | None = None,
                **parts: Any) -> int:
    """Run the gateway until SIGTERM or SIGINT, then shut down gracefully; returns the exit code.
    `parts`: keyword arguments of create_server (metrics, backend, history, ...)."""
    server, _ = create_server(settings, **parts)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    side: asyncio.Task | None = None
    try:
        await server.start()
        if on_started is not None:
            side = asyncio.create_task(on_started(server))
        await stop.wait()
        log.info("signal received")
        if side is not None and not side.done():
            side.cancel()
    finally:
        await server.stop()                       # signals stay ours until the gateway has drained
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return 0


class ThreadedGateway:
    """A gateway on its own event loop in a daemon thread (for synchronous callers)."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None, **parts: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="routerkt-gateway", daemon=True)
        self._thread.start()
        try:
            self.server: GatewayServer = self.call(self._create(settings, metrics=metrics, **parts))
        except BaseException:
            self._close_loop()
            raise
        self.grpc_port = self.server.grpc_port
        self.http_port = self.server.http_port

    @staticmethod
    async def _create(settings: Settings, **parts: Any) -> GatewayServer:
        server, _ = create_server(settings, **parts)
        return server

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
        """Run `coro` on the gateway's loop and wait (bounded) for its result."""
        future: Future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    def start(self) -> "ThreadedGateway":
        self.call(self.server.start())
        return self

    def stop(self, grace: float | None = None) -> None:
        try:
            self.call(self.server.stop(grace), timeout=(grace or self.server.settings.grace_period_s) + 30)
        finally:
            self._close_loop()

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> "ThreadedGateway":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


WILDCARDS = ("0.0.0.0", "::", "[::]")


def _bind(host: str, port: int) -> socket.socket:
    """The HTTP socket. A wildcard host binds as gRPC does: one dual-stack [::] socket (IPv4 and
    IPv6 alike) where the host has IPv6, else 0.0.0.0, so both ports listen on the same families."""
    if host in WILDCARDS and socket.has_ipv6:
        try:
            return _bind_family(socket.AF_INET6, "::", port, dual_stack=True)
        except OSError:
            pass                                   # no IPv6 here: IPv4 alone, as gRPC falls back
    if host in WILDCARDS:
        return _bind_family(socket.AF_INET, "0.0.0.0", port)
    return _bind_family(socket.AF_INET6 if ":" in host else socket.AF_INET, host.strip("[]"), port)


def _bind_family(family: int, host: str, port: int, dual_stack: bool = False) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        if dual_stack:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock

