"""`routerkt serve`: start tritonserver (or use a running one) and the gRPC/HTTP gateway in front of it.

    routerkt serve --repository model_repository [--grpc-port 50051] [--http-port 8080]
                   [--triton-url HOST:PORT[,HOST:PORT...]] [--sample-model NAME]
                   [--store sqlite:///PATH | redis://HOST:PORT/DB] [--store-keep N] [--store-ttl S]
                   [--rollout-policy FILE] [--no-track-outcomes] [--outcome-ttl S]

With --triton-url A,B,... (several Triton replicas, started elsewhere), inference is spread
round-robin over the ready ones, a replica failing its probe gets no traffic until it is back, and
an inference that failed as UNAVAILABLE on one is retried once on another (serving/backends/
triton_replicas.py). Several gateways can share one --store redis://...: they are interchangeable
behind a client balancing over them (serving/client.py connect_balanced).
Without --triton-url, the tritonserver bundled in nvidia-pytriton is started on free 127.0.0.1
ports (never the gateway's) with --model-control-mode=explicit, and the gateway waits until it is
ready. One log line per endpoint. Ctrl-C / SIGTERM: the gateway drains first, then Triton is
stopped (by PID). --sample-model NAME makes one Predict over real gRPC loopback once the model is
ready, with a small made-up history (ids from that model's vocabulary), prints the request and the
probabilities, then Observes the same history for a sample learner and Predicts by its learner id
(the store's answer equals the explicit one), and keeps serving. The session store defaults to the
SQLite file <state dir>/sessions.sqlite3; learner ids are keyed by HMAC with the secret in
ROUTERKT_STORE_SECRET or --store-secret-file (created when missing). With a store, outcome tracking
is on (what was served waits --outcome-ttl seconds for its answer). The rollout policy file
(default <state dir>/rollout.json, watched; absent = latest version everywhere) is what
`routerkt rollout` edits. Logs are JSON lines when stderr is not a terminal.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import time
from pathlib import Path

from routerkt.errors import UserError
from serving.settings import Settings

log = logging.getLogger("routerkt.serve")
SAMPLE_WAIT_S = 120.0          # how long --sample-model waits for the model to become ready


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the exception, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
                 "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(json_logs: bool | None = None, level: int = logging.INFO) -> None:
    """JSON lines when stderr is not a TTY (or when asked), plain text otherwise."""
    if json_logs is None:
        json_logs = not sys.stderr.isatty()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_logs else
                         logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = Settings()
    parser.add_argument("--repository", type=Path, required=True, help="Triton model repository (routerkt export)")
    parser.add_argument("--grpc-port", type=int, default=defaults.grpc_port, help="gateway gRPC port (0 = any free)")
    parser.add_argument("--http-port", type=int, default=defaults.http_port,
                        help="gateway HTTP port: /metrics, /livez, /readyz, /v1/predict (0 = any free, -1 = off)")
    parser.add_argument("--host", default=defaults.host, help="address the gateway binds")
    parser.add_argument("--triton-url", default=None, metavar="HOST:PORT[,HOST:PORT...]",
                        help="use the running Triton server(s) at HOST:PORT (gRPC) instead of starting one; "
                             "several, comma-separated: replicas, inference spread over the ready ones")
    parser.add_argument("--sample-model", default=None, metavar="NAME",
                        help="once ready, make one sample Predict with this model and print it")
    parser.add_argument("--max-inflight", type=int, default=defaults.max_inflight,
                        help="calls served at once; beyond, calls queue (--max-queued, --inflight-wait)")
    parser.add_argument("--max-queued", type=int, default=defaults.max_queued,
                        help="calls waiting for a slot at once; beyond: RESOURCE_EXHAUSTED at once")
    parser.add_argument("--inflight-wait", type=float, default=defaults.inflight_wait_s,
                        help="longest wait for a slot in seconds (0: no queue)")
    parser.add_argument("--grace-period", type=float, default=defaults.grace_period_s,
                        help="seconds in-flight calls may drain on shutdown")
    parser.add_argument("--triton-log", type=Path, default=None, help="write Triton's log here (default: a temp file)")
    parser.add_argument("--log-format", choices=("auto", "json", "plain"), default="auto",
                        help="log format (auto: JSON when stderr is not a terminal)")
    parser.add_argument("--state-dir", type=Path, default=Path(".routerkt"),
                        help="the serving state folder (default SQLite store, store secret)")
    parser.add_argument("--store", default=None, metavar="URL",
                        help="session store: sqlite:///PATH or redis://HOST:PORT/DB "
                             "(default: sqlite:///<state dir>/sessions.sqlite3); 'none' disables sessions")
    parser.add_argument("--store-keep", type=int, default=defaults.store_keep,
                        help="events kept per learner (at least the longest model window)")
    parser.add_argument("--store-ttl", type=float, default=defaults.store_ttl_s,
                        help="seconds after which an inactive learner is deleted (0 = never)")
    parser.add_argument("--store-secret-file", type=Path, default=None,
                        help="file with the HMAC secret for learner keys (default: <state dir>/store.secret)")
    parser.add_argument("--rollout-policy", type=Path, default=None, metavar="FILE",
                        help="rollout policy file, watched (default: <state dir>/rollout.json; see `routerkt rollout`)")
    parser.add_argument("--no-track-outcomes", action="store_true",
                        help="do not remember served predictions nor join observed answers with them")
    parser.add_argument("--outcome-ttl", type=float, default=defaults.outcome_ttl_s,
                        help="seconds a served prediction waits for the learner's answer")
    parser.add_argument("--backend", choices=("triton", "onnxruntime"), default="triton",
                        help="inference backend: Triton (default), or onnxruntime in-process (development)")


def run(args: argparse.Namespace) -> int:
    repository = Path(args.repository)
    if not repository.is_dir():
        raise UserError(f"model repository {repository} is not a folder (run `routerkt export` first)")
    settings = Settings(repository=repository, host=args.host, grpc_port=args.grpc_port,
                        http_port=None if args.http_port is not None and args.http_port < 0 else args.http_port,
                        max_inflight=args.max_inflight, max_queued=args.max_queued,
                        inflight_wait_s=args.inflight_wait, grace_period_s=args.grace_period,
                        store_keep=args.store_keep, store_ttl_s=args.store_ttl,
                        track_outcomes=not args.no_track_outcomes, outcome_ttl_s=args.outcome_ttl,
                        rollout_policy=args.rollout_policy or args.state_dir / "rollout.json")
    settings.validate()
    if args.triton_url:
        settings.triton_url = args.triton_url
        settings.validate()
    configure_logging(None if args.log_format == "auto" else args.log_format == "json")

    triton = None
    previous = signal.signal(signal.SIGTERM, _interrupt)       # SIGTERM while Triton starts: stop cleanly
    try:
        if args.backend == "onnxruntime":
            log.info("inference: onnxruntime in this process (development backend, no Triton)")
        elif args.triton_url:
            urls = settings.triton_urls
            log.info("Triton: using %s", urls[0] if len(urls) == 1 else
                     f"{len(urls)} replicas: " + ", ".join(f"{i}={url}" for i, url in enumerate(urls)))
        else:
            triton = _start_triton(settings, args.triton_log)
        code = asyncio.run(_serve(settings, args, triton))
    finally:
        if triton is not None:                                  # a second signal must not orphan Triton
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                log.info("Triton stopped (exit code %s)", triton.stop())
            finally:
                signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, previous)
    return code


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _start_triton(settings: Settings, log_path: Path | None):
    from serving.triton_launcher import TritonPorts, TritonServer, free_port

    taken = {settings.grpc_port, settings.http_port}
    ports = []
    while len(ports) < 3:                                       # free ports, never the gateway's
        port = free_port()
        if port not in taken and port not in ports:
            ports.append(port)
    server = TritonServer(settings.repository, ports=TritonPorts(*ports), log_path=log_path)
    log.info("Triton: starting tritonserver for %s", settings.repository)
    try:
        server.start(timeout=180)
    except RuntimeError as exc:                                 # one line; the tail of Triton's log follows
        server.stop()
        head, _, tail = str(exc).partition("\n")
        print(tail, file=sys.stderr)
        raise UserError(f"{head} (Triton's log: {server.log_path})") from None
    except BaseException:
        server.stop()
        raise
    settings.triton_url = server.grpc_url
    log.info("Triton: gRPC %s, HTTP http://%s, metrics http://%s/metrics (pid %s, log %s)",
             server.grpc_url, server.http_url, server.metrics_url, server.pid, server.log_path)
    return server


def _session_parts(settings: Settings, args: argparse.Namespace):
    """(store, keys) for the --store flags, or (None, None) with --store none."""
    from serving.sessions.keys import LearnerKeys, load_secret
    from serving.sessions.store import open_store

    url = args.store or f"sqlite:///{args.state_dir / 'sessions.sqlite3'}"
    if url == "none":
        return None, None
    keys = LearnerKeys(load_secret(args.store_secret_file or args.state_dir / "store.secret"))
    return open_store(url, ttl_s=settings.store_ttl_s), keys


async def _serve(settings: Settings, args: argparse.Namespace, triton=None) -> int:
    from serving.catalog import ModelCatalog
    from serving.metrics import Metrics
    from serving.server import GatewayServer, serve
    from serving.sessions.service import SessionService

    metrics, catalog = Metrics(outcome_window_s=settings.outcome_window_s), ModelCatalog(settings.repository)
    parts: dict[str, object] = {"metrics": metrics, "catalog": catalog}
    store, keys = _session_parts(settings, args)
    if store is not None:
        parts["sessions"] = SessionService(settings, store, keys, catalog, metrics)
        log.info("session store: %s; outcome tracking %s", store.kind, "on" if settings.track_outcomes else "off")
    log.info("rollout policy file: %s (watched)", settings.rollout_policy)
    if args.backend == "onnxruntime":
        from serving.backends.onnxruntime import OnnxRuntimeBackend
        parts["backend"] = OnnxRuntimeBackend(settings)

    async def started(server: GatewayServer) -> None:
        log.info("gateway gRPC: %s:%d (routerkt.v1.KnowledgeTracingService, grpc.health.v1, reflection)",
                 settings.host, server.grpc_port)
        if server.http_port is not None:
            base = f"http://{settings.host}:{server.http_port}"
            log.info("gateway HTTP: %s (/v1/predict, /v1/predict_batch, /docs)", base)
            log.info("gateway metrics: %s/metrics, health %s/livez %s/readyz", base, base, base)
        restarter = None
        if triton is not None:
            from serving.triton_restarts import TritonRestarter
            restarter = asyncio.create_task(TritonRestarter(triton, metrics).run())
        try:
            if args.sample_model:
                await sample_prediction(server, args.sample_model)
            if restarter is not None:
                await restarter
        finally:
            if restarter is not None:
                restarter.cancel()

    return await serve(settings, on_started=started, **parts)


async def sample_prediction(server, model: str) -> None:
    """One Predict over real gRPC loopback with a made-up history; prints request and answer."""
    import grpc
    from google.protobuf import json_format

    from serving.api import knowledge_tracing_pb2 as pb
    from serving.api import knowledge_tracing_pb2_grpc as pb_grpc

    deadline = time.monotonic() + SAMPLE_WAIT_S
    while not server.backend.ready_versions(model) and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    versions = server.catalog.versions(model)
    if not versions or not server.backend.ready_versions(model):
        log.error("sample prediction skipped: model %r is not ready (models ready: %s)", model,
                  server.backend.ready_models())
        return
    vocab = server.catalog.get(model, max(server.backend.ready_versions(model))).vocab
    questions = sorted(vocab.questions)[:8]
    history = [pb.Interaction(question_id=q, skill_id=vocab.question_skill.get(q, -1), correct=i % 2)
               for i, q in enumerate(questions[:5])]
    request = pb.PredictRequest(model=model, history=history,
                                candidates=[pb.Candidate(question_id=q) for q in questions[5:]])
    host = "127.0.0.1" if server.settings.host in ("0.0.0.0", "::") else server.settings.host
    async with grpc.aio.insecure_channel(f"{host}:{server.grpc_port}") as channel:
        stub = pb_grpc.KnowledgeTracingServiceStub(channel)
        try:
            response = await stub.Predict(request, timeout=10.0)
        except grpc.aio.AioRpcError as exc:
            log.error("sample prediction failed: %s: %s", exc.code().name, exc.details())
            return
        body = json_format.MessageToDict(request, preserving_proto_field_name=True,
                                         always_print_fields_with_no_presence=True)
        print("sample request: " + json.dumps(body), flush=True)
        pairs = ", ".join(f"question {c.question_id}: {p:.4f}"
                          for c, p in zip(request.candidates, response.probabilities))
        print(f"sample response: model {response.model} version {response.version}, "
              f"history_used {response.history_used}, P(correct) {pairs}", flush=True)
        if server.sessions is not None:
            await sample_session(stub, request, response)


async def sample_session(stub, request, explicit) -> None:
    """Observe the sample history for a sample learner, then Predict by learner id (same answer)."""
    import grpc

    from serving.api import knowledge_tracing_pb2 as pb

    learner = "routerkt-sample-learner"
    try:
        await stub.ForgetLearner(pb.ForgetLearnerRequest(learner_id=learner), timeout=10.0)
        events = [pb.Event(event_id=f"sample-{i}", question_id=h.question_id, skill_id=h.skill_id, correct=h.correct)
                  for i, h in enumerate(request.history)]
        observed = await stub.Observe(pb.ObserveRequest(learner_id=learner, events=events), timeout=10.0)
        by_id = await stub.Predict(pb.PredictRequest(model=request.model, learner_id=learner,
                                                     candidates=request.candidates), timeout=10.0)
    except grpc.aio.AioRpcError as exc:
        log.error("sample session failed: %s: %s", exc.code().name, exc.details())
        return
    diff = max(abs(a - b) for a, b in zip(by_id.probabilities, explicit.probabilities))
    print(f"sample session: Observe stored {observed.stored} events (history_length {observed.history_length}); "
          f"Predict by learner_id: P(correct) {', '.join(f'{p:.4f}' for p in by_id.probabilities)} "
          f"(max |diff| to the explicit history: {diff:.1e})", flush=True)
