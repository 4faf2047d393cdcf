"""`routerkt serve`: start tritonserver (or use a running one) and the gRPC/HTTP gateway in front of it.

    routerkt serve --repository model_repository [--grpc-port 50051] [--http-port 8080]
                   [--triton-url HOST:PORT[,HOST:PORT...]] [--sample-model NAME]
                   [--store sqlite:///PATH | redis://HOST:PORT/DB] [--store-keep N] [--store-ttl S]
                   [--rollout-policy FILE] [--no-track-outcomes] [--outcome-ttl S]
                   [--tls-cert PEM --tls-key PEM [--tls-client-ca PEM]] [--api-keys FILE] [--insecure]
                   [--triton-tls-ca PEM [--triton-tls-cert PEM --triton-tls-key PEM]]

With --triton-url A,B,... (several Triton replicas, started elsewhere), inference is spread
round-robin over the ready ones, a replica failing its probe gets no traffic until it is back, and
an inference that failed as UNAVAILABLE on one is retried once on another (serving/backends/
triton/replicas.py). Several gateways can share one --store redis://...: they are interchangeable
behind a client balancing over them (serving/client.py connect_balanced).
Without --triton-url, the tritonserver bundled in nvidia-pytriton is started with
--model-control-mode=explicit, its gRPC on a Unix socket in a private folder (mode 0700), its HTTP
off, its metrics on a free 127.0.0.1 port (never the gateway's), and its administrative APIs keyed
by --triton-key-file or a key made for this run (docs/security.md); the gateway waits until it is
ready. One log line per endpoint. Ctrl-C / SIGTERM: the gateway drains first, then Triton is
stopped (by PID). --sample-model NAME makes one Predict over real gRPC loopback once the model is
ready, with a small made-up history (ids from that model's vocabulary), prints the request and the
probabilities, then Observes the same history for a sample learner and Predicts by its learner id
(the store's answer equals the explicit one), and keeps serving. The session store defaults to the
SQLite file <state dir>/sessions.sqlite3; learner ids are keyed by HMAC with the secret in
ROUTERKT_STORE_SECRET or --store-secret-file (created when missing). With a store, outcome tracking
is on (what was served waits --outcome-ttl seconds for its answer). The rollout policy file
(default <state dir>/rollout.json, watched; absent = latest version everywhere) is what
`routerkt rollout` edits. Logs are JSON lines when stderr is not a terminal. A --host beyond
loopback needs --tls-cert/--tls-key and --api-keys, or --insecure (docs/security.md); on loopback,
without --api-keys, the state folder (made 0700) gets keys.jsonl with an admin key in admin.key
(0600), which the sample and the `routerkt` commands run from the same folder send (--insecure:
no keys, for a host of one user). With
--triton-tls-ca (and --triton-tls-cert/--triton-tls-key for Triton's mutual TLS) the gateway talks
TLS to every --triton-url Triton.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from pathlib import Path

from routerkt.errors import UserError
from serving.backends import BACKENDS
from serving.logs import configure_logging
from serving.security.client_flags import ENV_KEY
from serving.security.default_keys import default_keys, default_token, private_dir
from serving.security.exposure import is_loopback, refuse_exposure
from serving.settings import Settings

log = logging.getLogger("routerkt.serve")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = Settings()
    _add_gateway_arguments(parser, defaults)
    _add_state_arguments(parser, defaults)
    _add_security_arguments(parser, defaults)


def _add_gateway_arguments(parser: argparse.ArgumentParser, defaults: Settings) -> None:
    """The repository, the gateway's addresses, its Triton, and its limits."""
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


def _add_state_arguments(parser: argparse.ArgumentParser, defaults: Settings) -> None:
    """The state folder, the session store, rollout, outcome tracking and the inference backend."""
    parser.add_argument("--state-dir", type=Path, default=Path(".routerkt"),
                        help="the serving state folder (default SQLite store, store secret)")
    parser.add_argument("--store", default=None, metavar="URL",
                        help="session store: sqlite:///PATH or redis://HOST:PORT/DB "
                             "(default: sqlite:///<state dir>/sessions.sqlite3); 'none' disables sessions")
    parser.add_argument("--store-keep", type=int, default=defaults.store_keep,
                        help="events kept per learner (at least the longest model window)")
    parser.add_argument("--store-ttl", type=float, default=defaults.store_ttl_s,
                        help="seconds after which an inactive learner is deleted (0 = never)")
    parser.add_argument("--state-cache-mb", type=float, default=defaults.state_cache_mb,
                        help="MiB of learner states cached for Predict by learner_id on versions exported with "
                             "--step-graphs (docs/operations.md, 'Learner-state cache'); 0 = off")
    parser.add_argument("--prefix-cache", action="store_true",
                        help="stateless Predicts (the history sent) also use the learner-state cache, keyed by a "
                             "hash of the history prefix (off by default; docs/benchmarks.md)")
    parser.add_argument("--no-fill-on-observe", action="store_true",
                        help="Observe leaves cached learner states as they are (the next Predict by learner_id "
                             "appends the new answers); by default Observe advances them in the background")
    parser.add_argument("--store-secret-file", type=Path, default=None,
                        help="file with the HMAC secret for learner keys (default: <state dir>/store.secret)")
    parser.add_argument("--rollout-policy", type=Path, default=None, metavar="FILE",
                        help="rollout policy file, watched (default: <state dir>/rollout.json; "
                             "see `routerkt rollout`)")
    parser.add_argument("--no-track-outcomes", action="store_true",
                        help="do not remember served predictions nor join observed answers with them")
    parser.add_argument("--outcome-ttl", type=float, default=defaults.outcome_ttl_s,
                        help="seconds a served prediction waits for the learner's answer")
    parser.add_argument("--backend", choices=list(BACKENDS), default=defaults.backend,
                        help="inference backend: " + "; ".join(f"{name}: {entry.description}"
                                                               for name, entry in BACKENDS.items()))


def _add_security_arguments(parser: argparse.ArgumentParser, defaults: Settings) -> None:
    """TLS, API keys and their failure limits, Triton's key and TLS, the store's credentials (one group)."""
    security = parser.add_argument_group("security (docs/security.md)")
    security.add_argument("--tls-cert", type=Path, default=None, metavar="PEM",
                          help="TLS certificate (chain) for gRPC and HTTP; re-read when it changes")
    security.add_argument("--tls-key", type=Path, default=None, metavar="PEM", help="the certificate's private key")
    security.add_argument("--tls-client-ca", type=Path, default=None, metavar="PEM",
                          help="require client certificates signed by this CA (mTLS)")
    security.add_argument("--api-keys", type=Path, default=None, metavar="FILE",
                          help="API keys file (`routerkt keys issue`); every call then needs a key with its scope "
                               "(default on loopback: <state dir>/keys.jsonl, made with an admin key in "
                               "<state dir>/admin.key)")
    security.add_argument("--auth-failure-burst", type=int, default=defaults.auth_failure_burst, metavar="N",
                          help="failed key checks a client address (and a key id) may make at once before further "
                               "failures answer RESOURCE_EXHAUSTED / 429; valid keys are never limited (0: no limit)")
    security.add_argument("--auth-failure-rate", type=float, default=defaults.auth_failure_per_s, metavar="PER_S",
                          help="failed key checks given back to each client address and key id a second")
    security.add_argument("--insecure", action="store_true",
                          help="serve without API keys (on loopback: any local user may call every RPC) and allow "
                               "a non-loopback --host without TLS or keys; logged at every start")
    security.add_argument("--trusted-proxies", default="", metavar="ADDR[,ADDR...]",
                          help="reverse proxies (IP addresses or CIDR networks) whose X-Forwarded-For names the HTTP "
                               "client; default none: the connection's own address is the client's")
    security.add_argument("--triton-key-file", type=Path, default=None, metavar="FILE",
                          help="file holding KEY or HEADER=KEY sent on Triton's model-control calls "
                               "(Triton's --grpc-restricted-protocol); the Triton serve starts is keyed "
                               "with it too (default: a new key per run in <state dir>/triton.key, mode 0600)")
    security.add_argument("--triton-tls-ca", type=Path, default=None, metavar="PEM",
                          help="talk TLS to every --triton-url Triton and verify its certificate against this CA "
                               "(Triton's --grpc-use-ssl)")
    security.add_argument("--triton-tls-cert", type=Path, default=None, metavar="PEM",
                          help="client certificate the gateway presents to Triton (mutual TLS: Triton's "
                               "--grpc-use-ssl-mutual); with --triton-tls-key")
    security.add_argument("--triton-tls-key", type=Path, default=None, metavar="PEM",
                          help="the private key of --triton-tls-cert")
    security.add_argument("--store-password-file", type=Path, default=None, metavar="FILE",
                          help="password of the --store redis(s)://USER@HOST:PORT/DB user")
    security.add_argument("--store-ca-file", type=Path, default=None, metavar="PEM",
                          help="CA that signed the store's certificate (rediss://)")
    security.add_argument("--store-wait", action="store_true",
                          help="start even when the store refuses the user or password, and wait (unready "
                               "for sessions) until it accepts them; without it serve exits at once (code 2)")


def run(args: argparse.Namespace) -> int:
    repository = Path(args.repository)
    if not repository.is_dir():
        raise UserError(f"model repository {repository} is not a folder (run `routerkt export` first)")
    api_keys = args.api_keys
    if api_keys is None and not args.insecure and is_loopback(args.host):
        api_keys = default_keys(args.state_dir)                 # keys on by default (docs/security.md)
    else:
        private_dir(args.state_dir)
    settings = Settings(repository=repository, backend=args.backend, host=args.host, grpc_port=args.grpc_port,
                        http_port=None if args.http_port is not None and args.http_port < 0 else args.http_port,
                        max_inflight=args.max_inflight, max_queued=args.max_queued,
                        inflight_wait_s=args.inflight_wait, grace_period_s=args.grace_period,
                        store_keep=args.store_keep, store_ttl_s=args.store_ttl,
                        state_cache_mb=args.state_cache_mb, prefix_cache=args.prefix_cache,
                        fill_on_observe=not args.no_fill_on_observe,
                        track_outcomes=not args.no_track_outcomes, outcome_ttl_s=args.outcome_ttl,
                        rollout_policy=args.rollout_policy or args.state_dir / "rollout.json",
                        tls_cert=args.tls_cert, tls_key=args.tls_key, tls_client_ca=args.tls_client_ca,
                        api_keys=api_keys, insecure=args.insecure, trusted_proxies=args.trusted_proxies,
                        triton_key_file=args.triton_key_file,
                        auth_failure_burst=args.auth_failure_burst, auth_failure_per_s=args.auth_failure_rate,
                        triton_tls_ca=args.triton_tls_ca, triton_tls_cert=args.triton_tls_cert,
                        triton_tls_key=args.triton_tls_key)
    settings.validate()
    _check_triton_tls(settings, args)
    refuse_exposure(settings)                                   # before Triton starts
    if not args.store_wait:
        asyncio.run(_refuse_refused_credentials(args))          # before Triton starts
    if args.triton_url:
        settings.triton_url = args.triton_url
        settings.validate()
    configure_logging(None if args.log_format == "auto" else args.log_format == "json")

    triton = None
    previous = signal.signal(signal.SIGTERM, _interrupt)       # SIGTERM while Triton starts: stop cleanly
    try:
        if not BACKENDS[settings.backend].uses_triton:
            log.info("inference: %s", BACKENDS[settings.backend].description)
        elif args.triton_url:
            urls = settings.triton_urls
            tls = ("" if settings.triton_tls_ca is None and settings.triton_tls_cert is None else
                   " over mutual TLS" if settings.triton_tls_cert is not None else " over TLS")
            log.info("Triton: using %s%s", urls[0] if len(urls) == 1 else
                     f"{len(urls)} replicas: " + ", ".join(f"{i}={url}" for i, url in enumerate(urls)), tls)
        else:
            from serving.security.triton_access import access_for, serve_key_file
            from serving.tritonserver.launcher import start_beside_gateway
            settings.triton_key_file = serve_key_file(args.triton_key_file, args.state_dir)
            gateway_ports = {settings.grpc_port, settings.http_port}
            triton = start_beside_gateway(settings.repository, gateway_ports, args.triton_log,
                                          access_for(settings.triton_key_file))
            settings.triton_url = triton.grpc_url
        code = asyncio.run(_serve(settings, args, triton))
    finally:
        if triton is not None:                                  # a second signal must not orphan Triton
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                log.info("Triton stopped (exit code %s)", triton.close())
            finally:
                signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, previous)
    return code


def http_base(settings: Settings, port: int) -> str:
    """The gateway's HTTP address as clients write it: https:// with TLS, [host] for IPv6."""
    host = f"[{settings.host}]" if ":" in settings.host and not settings.host.startswith("[") else settings.host
    return f"{'https' if settings.tls_cert is not None else 'http'}://{host}:{port}"


def _check_triton_tls(settings: Settings, args: argparse.Namespace) -> None:
    """UserError (one line) for --triton-tls-* without --triton-url (the Triton serve starts is
    reached over a private Unix socket, not TLS) or naming a file that cannot be read."""
    paths = [path for path in (settings.triton_tls_ca, settings.triton_tls_cert, settings.triton_tls_key) if path]
    if paths and not args.triton_url:
        raise UserError("--triton-tls-ca/--triton-tls-cert/--triton-tls-key need --triton-url: the Triton "
                        "serve starts is reached over a private Unix socket")
    for path in paths:
        try:
            path.read_bytes()
        except OSError as exc:
            raise UserError(f"cannot read {path}: {exc.strerror}") from None


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _store_url(args: argparse.Namespace) -> str:
    return args.store or f"sqlite:///{args.state_dir / 'sessions.sqlite3'}"


async def _refuse_refused_credentials(args: argparse.Namespace) -> None:
    """UserError (one line, exit code 2) when the store server answers but refuses the gateway's
    user or password: a configuration error that waiting does not fix. A store that does not answer
    at all is waited for, unready, as before."""
    from serving.sessions.factory import open_store
    from serving.sessions.store import StoreUnavailable

    url = _store_url(args)
    if not url.startswith(("redis://", "rediss://")):             # only a server can refuse credentials
        return
    store = open_store(url, password_file=args.store_password_file, ca_file=args.store_ca_file)
    try:
        await store.ping()
    except StoreUnavailable as exc:
        if exc.credentials_refused:
            raise UserError(f"session store: {str(exc)[:300]}; --store-wait starts anyway and waits") from None
    finally:
        await store.close()


def _session_parts(settings: Settings, args: argparse.Namespace):
    """(store, keys) for the --store flags, or (None, None) with --store none."""
    from serving.sessions.keys import LearnerKeys, load_secret
    from serving.sessions.factory import open_store

    url = _store_url(args)
    if url == "none":
        return None, None
    keys = LearnerKeys(load_secret(args.store_secret_file or args.state_dir / "store.secret"))
    return open_store(url, ttl_s=settings.store_ttl_s, password_file=args.store_password_file,
                      ca_file=args.store_ca_file), keys


async def _serve(settings: Settings, args: argparse.Namespace, triton=None) -> int:
    from serving.cli.demo import sample_prediction
    from serving.server import GatewayServer, serve

    parts: dict[str, object] = {}
    store, keys = _session_parts(settings, args)
    if store is not None:
        parts.update(store=store, keys=keys)
        log.info("session store: %s; outcome tracking %s", store.kind, "on" if settings.track_outcomes else "off")
    log.info("rollout policy file: %s (watched)", settings.rollout_policy)

    async def started(server: GatewayServer) -> None:
        log.info("gateway gRPC: %s:%d (routerkt.v1.KnowledgeTracingService, grpc.health.v1, reflection)",
                 settings.host, server.grpc_port)
        if server.http_port is not None:
            base = http_base(settings, server.http_port)
            log.info("gateway HTTP: %s (/v1/predict, /v1/predict_batch, /docs)", base)
            log.info("gateway metrics: %s/metrics, health %s/livez %s/readyz", base, base, base)
        restarter = None
        if triton is not None:
            from serving.tritonserver.restarts import TritonRestarter
            restarter = asyncio.create_task(TritonRestarter(triton, server.metrics).run())
        try:
            if args.sample_model:
                key = None if settings.api_keys is None else os.environ.get(ENV_KEY) or default_token(args.state_dir)
                await sample_prediction(server, args.sample_model, api_key=key)
            if restarter is not None:
                await restarter
        finally:
            if restarter is not None:
                restarter.cancel()

    return await serve(settings, on_started=started, **parts)
