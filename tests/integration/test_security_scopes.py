"""The scope matrix, generated from the proto's service descriptor and the HTTP app's route table
(a new RPC or route without a scope in serving/security/scopes.py fails here): every method with
no key, a malformed key, a wrong secret, an unknown key id and a key of each scope; health and
metrics without a key; and the audit log of ForgetLearner and rollout changes."""
from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from serving.api import knowledge_tracing_pb2 as pb
from serving.metrics import Metrics
from serving.security import scopes
from serving.server import ThreadedGateway
from serving.sessions.keys import LearnerKeys
from serving.sessions.sqlite_store import SqliteStore
from serving.settings import Settings
from serving.transport.http_api import create_app
from tests.integration.security_helpers import FakeBackend, issue_all, wrong_secret

pytestmark = pytest.mark.integration

SERVICE = pb.DESCRIPTOR.services_by_name["KnowledgeTracingService"]
DENIED = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}
LEARNER = "raw-learner-name-4711"


def http_routes() -> list[tuple[str, str]]:
    """(method, path) of every route of the gateway's HTTP app (HEAD is GET's)."""
    stub = SimpleNamespace(service=SimpleNamespace(settings=Settings(), metrics=Metrics()), sessions=None,
                           recommender=None, policy=None, health=None, guard=None)
    stub.guard = SimpleNamespace(enabled=False)
    app = create_app(stub)
    return sorted({(method, route.path) for route in app.routes for method in getattr(route, "methods", ()) or ()
                   if method != "HEAD"})


def callers(tokens: dict[str, str]) -> dict[str, str | None]:
    """caller name -> the authorization header value it sends (None: none)."""
    secret = tokens["admin"].split(".", 1)[1]
    return {"no key": None, "not bearer": tokens["admin"], "wrong secret": wrong_secret(tokens["admin"]),
            "unknown id": f"Bearer nobody.{secret}",
            **{f"scope {scope}": f"Bearer {token}" for scope, token in tokens.items()}}


@pytest.fixture(scope="module")
def gateway(handmade_repository, tmp_path_factory):
    folder = tmp_path_factory.mktemp("scopes")
    tokens = issue_all(folder / "keys.jsonl")
    settings = Settings(repository=handmade_repository, grpc_port=0, http_port=0, grace_period_s=0.5,
                        api_keys=folder / "keys.jsonl", rollout_policy=folder / "rollout.json",
                        auth_failure_burst=0)    # the matrix fails hundreds of times from one address;
                                                 # the limit: tests/integration/test_security_failures.py
    gw = ThreadedGateway(settings, backend=FakeBackend(), store=SqliteStore(folder / "sessions.sqlite3"),
                         keys=LearnerKeys(b"k" * 32)).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}")
    http = httpx.Client(base_url=f"http://127.0.0.1:{gw.http_port}", timeout=10, trust_env=False)
    try:
        yield SimpleNamespace(gw=gw, channel=channel, http=http, tokens=tokens, folder=folder)
    finally:
        http.close()
        channel.close()
        gw.stop(0.5)


def test_every_rpc_and_route_has_a_scope() -> None:
    missing = [m.full_name for m in SERVICE.methods if f"/{SERVICE.full_name}/{m.name}" not in scopes.GRPC]
    assert missing == [], "add these RPCs to serving/security/scopes.py GRPC"
    assert [r for r in http_routes() if r not in scopes.HTTP] == [], "add these routes to scopes.HTTP"
    assert set(scopes.GRPC.values()) | set(scopes.HTTP.values()) <= {*scopes.SCOPES, scopes.PUBLIC}


def expected(scope: str, caller: str) -> str:
    if scope == scopes.PUBLIC or caller == f"scope {scope}":
        return "allowed"
    return "forbidden" if caller.startswith("scope ") else "unauthenticated"


@pytest.mark.parametrize("method", [m.name for m in SERVICE.methods])
def test_grpc_scope_matrix(gateway, method: str) -> None:
    descriptor = SERVICE.methods_by_name[method]
    request_type = getattr(pb, descriptor.input_type.name)
    call = gateway.channel.unary_unary(f"/{SERVICE.full_name}/{method}", request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=lambda b: b)
    scope = scopes.grpc_scope(f"/{SERVICE.full_name}/{method}")
    messages = set()
    for caller, header in callers(gateway.tokens).items():
        metadata = () if header is None else (("authorization", header),)
        try:
            call(request_type(), timeout=5, metadata=metadata)
            code, details = grpc.StatusCode.OK, ""
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details()
        outcome = {grpc.StatusCode.UNAUTHENTICATED: "unauthenticated",
                   grpc.StatusCode.PERMISSION_DENIED: "forbidden"}.get(code, "allowed")
        assert outcome == expected(scope, caller), f"{method} by {caller}: {code} {details}"
        if outcome == "unauthenticated":
            messages.add(details)
    assert len(messages) <= 1, "denials must not tell a wrong secret from an unknown key id"


@pytest.mark.parametrize("route", http_routes(), ids=lambda r: f"{r[0]} {r[1]}")
def test_http_scope_matrix(gateway, route: tuple[str, str]) -> None:
    method, path = route
    scope = scopes.http_scope(method, path)
    bodies = set()
    for caller, header in callers(gateway.tokens).items():
        headers = {} if header is None else {"authorization": header}
        answer = gateway.http.request(method, path.replace("{model}", "kt"), headers=headers,
                                      json={} if method in ("POST", "PUT") else None)
        outcome = {401: "unauthenticated", 403: "forbidden"}.get(answer.status_code, "allowed")
        assert outcome == expected(scope, caller), f"{method} {path} by {caller}: {answer.status_code}"
        if outcome == "unauthenticated":
            bodies.add(answer.text)
    assert len(bodies) <= 1


def test_health_and_metrics_need_no_key(gateway) -> None:
    health = health_pb2_grpc.HealthStub(gateway.channel)
    assert health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status == \
        health_pb2.HealthCheckResponse.SERVING
    for path in ("/livez", "/readyz", "/metrics"):
        assert gateway.http.get(path).status_code == 200, path


def audit_lines(caplog) -> list[dict]:
    return [json.loads(r.getMessage().split(" ", 1)[1]) for r in caplog.records if r.name == "routerkt.audit"]


def test_forget_learner_and_rollout_changes_are_audited(gateway, caplog) -> None:
    caplog.set_level(logging.INFO)
    auth = lambda scope: (("authorization", f"Bearer {gateway.tokens[scope]}"),)   # noqa: E731
    observe = gateway.channel.unary_unary(f"/{SERVICE.full_name}/Observe", pb.ObserveRequest.SerializeToString,
                                          pb.ObserveResponse.FromString)
    forget = gateway.channel.unary_unary(f"/{SERVICE.full_name}/ForgetLearner",
                                         pb.ForgetLearnerRequest.SerializeToString, pb.ForgetLearnerResponse.FromString)
    observe(pb.ObserveRequest(learner_id=LEARNER, events=[pb.Event(event_id="e1", question_id=100, skill_id=7, correct=1)]),
            timeout=5, metadata=auth("observe"))
    assert forget(pb.ForgetLearnerRequest(learner_id=LEARNER), timeout=5, metadata=auth("admin")).existed
    policy = {"policy": "pinned", "version": 1}
    answer = gateway.http.put("/v1/rollout/kt", json=policy, headers={"authorization": f"Bearer {gateway.tokens['admin']}"})
    assert answer.status_code == 200, answer.text
    assert json.loads((gateway.folder / "rollout.json").read_text())["models"]["kt"]["version"] == 1
    lines = audit_lines(caplog)
    assert [(line["action"], line["key_id"]) for line in lines] == [("forget_learner", "admin"), ("rollout_change", "admin")]
    assert lines[0]["deleted"] == 1 and lines[1]["model"] == "kt" and all(line["time"] for line in lines)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert LEARNER not in logged
    assert not any(token.split(".", 1)[1] in logged for token in gateway.tokens.values())


def test_the_cli_reads_a_keyed_gateway_with_its_key_file(gateway, tmp_path, capsys, monkeypatch) -> None:
    """`routerkt rollout status --gateway` sends --api-key-file (or $ROUTERKT_API_KEY) as a bearer key."""
    from routerkt.cli import main

    monkeypatch.delenv("ROUTERKT_API_KEY", raising=False)
    url = f"http://127.0.0.1:{gateway.gw.http_port}"
    policy = ["rollout", "status", "--file", str(tmp_path / "none.json"), "--gateway", url]
    assert main(policy) == 2                                           # GET /v1/rollout needs admin
    assert "401" in capsys.readouterr().err
    (tmp_path / "key").write_text(gateway.tokens["admin"] + "\n")
    assert main([*policy, "--api-key-file", str(tmp_path / "key")]) == 0
    assert "policy file in force" in capsys.readouterr().out
    monkeypatch.setenv("ROUTERKT_API_KEY", gateway.tokens["predict"])
    assert main(policy) == 2                                           # a predict key is not enough
    assert "403" in capsys.readouterr().err
