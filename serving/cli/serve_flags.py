"""The flags of `routerkt serve`, each recording that it was given, so that only given flags override --config."""
from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from routerkt.flag_groups import Store, Switch, add_store_credentials, given
from serving.backends import BACKENDS
from serving.settings import Settings

# a flag's dest -> the Settings field it sets, where the names differ (dests the deployment tests read)
FIELD_OF = {"inflight_wait": "inflight_wait_s", "grace_period": "grace_period_s", "store_ttl": "store_ttl_s",
            "outcome_ttl": "outcome_ttl_s"}
SERVE_ONLY = ("config", "state_dir", "store", "store_secret_file", "store_password_file", "store_ca_file",
              "store_wait", "sample_model", "triton_log", "log_format")     # dests that are no Settings field
LOG_FORMATS = ("auto", "json", "plain")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = Settings()
    parser.add_argument("--config", type=Path, default=None, metavar="FILE", action=Store,
                        help="TOML file setting any Settings field and the [serve] options; the flags given "
                             "override it (docs/configuration.md)")
    _add_gateway_arguments(parser, defaults)
    _add_state_arguments(parser, defaults)
    _add_security_arguments(parser, defaults)


def given_values(args: argparse.Namespace) -> tuple[dict[str, object], dict[str, object]]:
    """(Settings fields, serve options) of the flags the command line gave; defaults left out."""
    names = {f.name for f in fields(Settings)}
    settings: dict[str, object] = {}
    serve: dict[str, object] = {}
    for dest in given(args) - {"config"}:
        value = getattr(args, dest)
        field = FIELD_OF.get(dest, dest)
        if field in names:
            settings[field] = None if field == "http_port" and value is not None and value < 0 else value
        elif dest in SERVE_ONLY:
            serve[dest] = value
        else:                                    # a new flag that sets neither: declare where it goes
            raise AssertionError(f"serve flag dest {dest!r} is neither a Settings field nor in SERVE_ONLY")
    return settings, serve


def _add_gateway_arguments(parser: argparse.ArgumentParser, defaults: Settings) -> None:
    """The repository, the gateway's addresses, its Triton, and its limits."""
    parser.add_argument("--repository", type=Path, default=None, action=Store,
                        help="Triton model repository (routerkt export); required, here or in --config")
    parser.add_argument("--grpc-port", type=int, default=defaults.grpc_port, action=Store,
                        help="gateway gRPC port (0 = any free)")
    parser.add_argument("--http-port", type=int, default=defaults.http_port, action=Store,
                        help="gateway HTTP port: /metrics, /livez, /readyz, /v1/predict (0 = any free, -1 = off)")
    parser.add_argument("--host", default=defaults.host, action=Store, help="address the gateway binds")
    parser.add_argument("--triton-url", default=None, metavar="HOST:PORT[,HOST:PORT...]", action=Store,
                        help="use the running Triton server(s) at HOST:PORT (gRPC) instead of starting one; "
                             "several, comma-separated: replicas, inference spread over the ready ones")
    parser.add_argument("--sample-model", default=None, metavar="NAME", action=Store,
                        help="once ready, make one sample Predict with this model and print it")
    parser.add_argument("--max-inflight", type=int, default=defaults.max_inflight, action=Store,
                        help="calls served at once; beyond, calls queue (--max-queued, --inflight-wait)")
    parser.add_argument("--max-queued", type=int, default=defaults.max_queued, action=Store,
                        help="calls waiting for a slot at once; beyond: RESOURCE_EXHAUSTED at once")
    parser.add_argument("--inflight-wait", type=float, default=defaults.inflight_wait_s, action=Store,
                        help="longest wait for a slot in seconds (0: no queue)")
    parser.add_argument("--grace-period", type=float, default=defaults.grace_period_s, action=Store,
                        help="seconds in-flight calls may drain on shutdown")
    parser.add_argument("--triton-log", type=Path, default=None, action=Store,
                        help="write Triton's log here (default: a temp file)")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="auto", action=Store,
                        help="log format (auto: JSON when stderr is not a terminal)")


def _add_state_arguments(parser: argparse.ArgumentParser, defaults: Settings) -> None:
    """The state folder, the session store, rollout, outcome tracking and the inference backend."""
    parser.add_argument("--state-dir", type=Path, default=Path(".routerkt"), action=Store,
                        help="the serving state folder (default SQLite store, store secret)")
    parser.add_argument("--store", default=None, metavar="URL", action=Store,
                        help="session store: sqlite:///PATH or redis://HOST:PORT/DB "
                             "(default: sqlite:///<state dir>/sessions.sqlite3); 'none' disables sessions")
    parser.add_argument("--store-keep", type=int, default=defaults.store_keep, action=Store,
                        help="events kept per learner (at least the longest model window)")
    parser.add_argument("--store-ttl", type=float, default=defaults.store_ttl_s, action=Store,
                        help="seconds after which an inactive learner is deleted (0 = never)")
    parser.add_argument("--state-cache-mb", type=float, default=defaults.state_cache_mb, action=Store,
                        help="MiB of learner states cached for Predict by learner_id on versions exported with "
                             "--step-graphs (docs/operations.md, 'Learner-state cache'); 0 = off")
    parser.add_argument("--prefix-cache", default=defaults.prefix_cache, action=Switch,
                        help="stateless Predicts (the history sent) also use the learner-state cache, keyed by a "
                             "hash of the history prefix (docs/benchmarks.md)")
    parser.add_argument("--held-states", default=defaults.held_states, action=Switch,
                        help="Triton keeps the learner states where the model's config declares it (a step call "
                             "then carries a key, not the state; docs/operations.md, 'Held states'); "
                             "--no-held-states: the gateway sends them")
    parser.add_argument("--fill-on-observe", default=defaults.fill_on_observe, action=Switch,
                        help="Observe advances cached learner states in the background (--no-fill-on-observe: "
                             "the next Predict by learner_id appends the new answers)")
    parser.add_argument("--store-secret-file", type=Path, default=None, action=Store,
                        help="file with the HMAC secret for learner keys (default: <state dir>/store.secret)")
    parser.add_argument("--rollout-policy", type=Path, default=None, metavar="FILE", action=Store,
                        help="rollout policy file, watched (default: <state dir>/rollout.json; "
                             "see `routerkt rollout`)")
    parser.add_argument("--track-outcomes", default=defaults.track_outcomes, action=Switch,
                        help="remember served predictions and join observed answers with them (with a store)")
    parser.add_argument("--outcome-ttl", type=float, default=defaults.outcome_ttl_s, action=Store,
                        help="seconds a served prediction waits for the learner's answer")
    parser.add_argument("--backend", choices=list(BACKENDS), default=defaults.backend, action=Store,
                        help="inference backend: " + "; ".join(f"{name}: {entry.description}"
                                                               for name, entry in BACKENDS.items()))


def _add_security_arguments(parser: argparse.ArgumentParser, defaults: Settings) -> None:
    """TLS, API keys and their failure limits, Triton's key and TLS, the store's credentials (one group)."""
    security = parser.add_argument_group("security (docs/security.md)")
    security.add_argument("--tls-cert", type=Path, default=None, metavar="PEM", action=Store,
                          help="TLS certificate (chain) for gRPC and HTTP; re-read when it changes")
    security.add_argument("--tls-key", type=Path, default=None, metavar="PEM", action=Store,
                          help="the certificate's private key")
    security.add_argument("--tls-client-ca", type=Path, default=None, metavar="PEM", action=Store,
                          help="require client certificates signed by this CA (mTLS)")
    security.add_argument("--api-keys", type=Path, default=None, metavar="FILE", action=Store,
                          help="API keys file (`routerkt keys issue`); every call then needs a key with its scope "
                               "(default on loopback: <state dir>/keys.jsonl, made with an admin key in "
                               "<state dir>/admin.key)")
    security.add_argument("--auth-failure-burst", type=int, default=defaults.auth_failure_burst, metavar="N",
                          action=Store,
                          help="failed key checks a client address (and a key id) may make at once before further "
                               "failures answer RESOURCE_EXHAUSTED / 429; valid keys are never limited (0: no limit)")
    security.add_argument("--auth-failure-per-s", "--auth-failure-rate", dest="auth_failure_per_s", type=float,
                          default=defaults.auth_failure_per_s, metavar="PER_S", action=Store,
                          help="failed key checks given back to each client address and key id a second "
                               "(--auth-failure-rate: its former name)")
    security.add_argument("--insecure", default=defaults.insecure, action=Switch,
                          help="serve without API keys (on loopback: any local user may call every RPC) and allow "
                               "a non-loopback --host without TLS or keys; logged at every start")
    security.add_argument("--trusted-proxies", default=",".join(defaults.trusted_proxies), metavar="ADDR[,ADDR...]",
                          action=Store,
                          help="reverse proxies (IP addresses or CIDR networks) whose X-Forwarded-For names the HTTP "
                               "client; default none: the connection's own address is the client's")
    security.add_argument("--triton-key-file", type=Path, default=None, metavar="FILE", action=Store,
                          help="file holding KEY or HEADER=KEY sent on Triton's model-control calls "
                               "(Triton's --grpc-restricted-protocol); the Triton serve starts is keyed "
                               "with it too (default: a new key per run in <state dir>/triton.key, mode 0600)")
    security.add_argument("--triton-tls-ca", type=Path, default=None, metavar="PEM", action=Store,
                          help="talk TLS to every --triton-url Triton and verify its certificate against this CA "
                               "(Triton's --grpc-use-ssl)")
    security.add_argument("--triton-tls-cert", type=Path, default=None, metavar="PEM", action=Store,
                          help="client certificate the gateway presents to Triton (mutual TLS: Triton's "
                               "--grpc-use-ssl-mutual); with --triton-tls-key")
    security.add_argument("--triton-tls-key", type=Path, default=None, metavar="PEM", action=Store,
                          help="the private key of --triton-tls-cert")
    add_store_credentials(security)
    security.add_argument("--store-wait", default=False, action=Switch,
                          help="start even when the store refuses the user or password, and wait (unready "
                               "for sessions) until it accepts them; without it serve exits at once (code 2)")
