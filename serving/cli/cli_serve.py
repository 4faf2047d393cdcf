"""`routerkt serve`: start tritonserver (or use a running one) and the gRPC/HTTP gateway in front of it.

    routerkt serve [--config serve.toml] --repository model_repository [--grpc-port 50051] [--http-port 8080]
                   [--triton-url HOST:PORT[,HOST:PORT...]] [--sample-model NAME]
                   [--store sqlite:///PATH | redis://HOST:PORT/DB] [--store-keep N] [--store-ttl S]
                   [--rollout-policy FILE] [--no-track-outcomes] [--outcome-ttl S]
                   [--tls-cert PEM --tls-key PEM [--tls-client-ca PEM]] [--api-keys FILE] [--insecure]
                   [--triton-tls-ca PEM [--triton-tls-cert PEM --triton-tls-key PEM]]

With --triton-url A,B,... (several Triton replicas, started elsewhere), inference is spread
round-robin over the ready ones, a replica failing its probe gets no traffic until it is back, and
an inference that failed as UNAVAILABLE on one is retried once on another (serving/backends/
triton/replica_set.py). Several gateways can share one --store redis://...: they are interchangeable
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
TLS to every --triton-url Triton. --config FILE (TOML) sets any Settings field and the [serve]
options; a flag given on the command line overrides the file (serving/cli/serve_config.py,
docs/configuration.md). The Settings are validated once everything is decided, and frozen.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal

from routerkt.errors import UserError
from serving.backends import BACKENDS
from serving.cli import serve_flags
from serving.cli.serve_config import ServeOptions, merged
from serving.logs import configure_logging
from serving.security.client_flags import ENV_KEY
from serving.security.default_keys import default_keys, default_token, private_dir
from serving.security.exposure import is_loopback, refuse_exposure
from serving.settings import Settings

log = logging.getLogger("routerkt.serve")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    serve_flags.add_arguments(parser)


def resolve(args: argparse.Namespace) -> tuple[Settings, ServeOptions, bool]:
    """(Settings, serve options, whether triton_url was chosen) of the command line and its --config
    file, validated, with serve's own defaults decided (the rollout policy and, on loopback, API keys
    in the state folder). Without a chosen triton_url, run() starts Triton and then replaces
    triton_url and triton_key_file."""
    chosen, options = merged(args)
    if chosen.get("repository") is None:
        raise UserError("routerkt serve needs a model repository: --repository DIR (or repository in --config)")
    settings = Settings(**chosen).validate()                    # every check before a file is made
    if not settings.repository.is_dir():
        raise UserError(f"model repository {settings.repository} is not a folder (run `routerkt export` first)")
    api_keys = settings.api_keys
    if api_keys is None and not settings.insecure and is_loopback(settings.host):
        api_keys = default_keys(options.state_dir)              # keys on by default (docs/security.md)
    else:
        private_dir(options.state_dir)
    settings = dataclasses.replace(settings, api_keys=api_keys,
                                   rollout_policy=settings.rollout_policy or options.state_dir / "rollout.json")
    return settings.validate(), options, "triton_url" in chosen


def run(args: argparse.Namespace) -> int:
    settings, options, external_triton = resolve(args)          # external: serve starts no Triton
    _check_triton_tls(settings, external_triton)
    refuse_exposure(settings)                                   # before Triton starts
    if not options.store_wait:
        asyncio.run(_refuse_refused_credentials(options))       # before Triton starts
    configure_logging(None if options.log_format == "auto" else options.log_format == "json")

    triton = None
    previous = signal.signal(signal.SIGTERM, _interrupt)       # SIGTERM while Triton starts: stop cleanly
    try:
        if not BACKENDS[settings.backend].uses_triton:
            log.info("inference: %s", BACKENDS[settings.backend].description)
        elif external_triton:
            urls = settings.triton_urls
            tls = ("" if settings.triton_tls_ca is None and settings.triton_tls_cert is None else
                   " over mutual TLS" if settings.triton_tls_cert is not None else " over TLS")
            log.info("Triton: using %s%s", urls[0] if len(urls) == 1 else
                     f"{len(urls)} replicas: " + ", ".join(f"{i}={url}" for i, url in enumerate(urls)), tls)
        else:
            from serving.security.triton_access import access_for, serve_key_file
            from serving.tritonserver.launcher import start_beside_gateway
            key_file = serve_key_file(settings.triton_key_file, options.state_dir)
            gateway_ports = {settings.grpc_port, settings.http_port}
            triton = start_beside_gateway(settings.repository, gateway_ports, options.triton_log,
                                          access_for(key_file))
            settings = dataclasses.replace(settings, triton_key_file=key_file, triton_url=triton.grpc_url).validate()
        code = asyncio.run(_serve(settings, options, triton))
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


def _check_triton_tls(settings: Settings, external_triton: bool) -> None:
    """UserError (one line) for --triton-tls-* without --triton-url (the Triton serve starts is
    reached over a private Unix socket, not TLS) or naming a file that cannot be read."""
    paths = [path for path in (settings.triton_tls_ca, settings.triton_tls_cert, settings.triton_tls_key) if path]
    if paths and not external_triton:
        raise UserError("--triton-tls-ca/--triton-tls-cert/--triton-tls-key need --triton-url: the Triton "
                        "serve starts is reached over a private Unix socket")
    for path in paths:
        try:
            path.read_bytes()
        except OSError as exc:
            raise UserError(f"cannot read {path}: {exc.strerror}") from None


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


async def _refuse_refused_credentials(options: ServeOptions) -> None:
    """UserError (one line, exit code 2) when the store server answers but refuses the gateway's
    user or password: a configuration error that waiting does not fix. A store that does not answer
    at all is waited for, unready, as before."""
    from serving.sessions.factory import open_store
    from serving.sessions.store import StoreUnavailable

    url = options.store_url
    if not url.startswith(("redis://", "rediss://")):             # only a server can refuse credentials
        return
    store = open_store(url, password_file=options.store_password_file, ca_file=options.store_ca_file)
    try:
        await store.ping()
    except StoreUnavailable as exc:
        if exc.credentials_refused:
            raise UserError(f"session store: {str(exc)[:300]}; --store-wait starts anyway and waits") from None
    finally:
        await store.close()


def _session_parts(settings: Settings, options: ServeOptions):
    """(store, keys) for the --store options, or (None, None) with --store none."""
    from serving.sessions.keys import LearnerKeys, load_secret
    from serving.sessions.factory import open_store

    url = options.store_url
    if url == "none":
        return None, None
    keys = LearnerKeys(load_secret(options.store_secret_file or options.state_dir / "store.secret"))
    return open_store(url, ttl_s=settings.store_ttl_s, password_file=options.store_password_file,
                      ca_file=options.store_ca_file), keys


async def _serve(settings: Settings, options: ServeOptions, triton=None) -> int:
    from serving.cli.demo import sample_prediction
    from serving.server import GatewayServer, serve

    parts: dict[str, object] = {}
    store, keys = _session_parts(settings, options)
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
            if options.sample_model:
                key = None if settings.api_keys is None else os.environ.get(ENV_KEY) or default_token(options.state_dir)
                await sample_prediction(server, options.sample_model, api_key=key)
            if restarter is not None:
                await restarter
        finally:
            if restarter is not None:
                restarter.cancel()

    return await serve(settings, on_started=started, **parts)
