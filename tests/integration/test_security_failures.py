"""Failed keys are seen and slowed, over real gRPC and HTTP (serving/security/failures.py): every
failure is counted by transport and reason with no key material in the labels, logged at a bounded
rate with the peer and the key id (PERMISSION_DENIED on ForgetLearner included), limited per peer
and per key id (RESOURCE_EXHAUSTED / 429 past the budget) while a valid key from the same address
still passes at once; HTTP checks the key before it reads or parses the body; X-Forwarded-For counts
only from --trusted-proxies; and caller-chosen text reaches the log only escaped."""
from __future__ import annotations

import logging
import re
import socket
import time

import grpc
import httpx
import pytest

from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.server import ThreadedGateway
from serving.sessions.keys import LearnerKeys
from serving.sessions.sqlite_store import SqliteStore
from serving.settings import Settings
from tests.helpers import grpc_status as code
from tests.integration.security_helpers import FakeBackend, issue_all, wrong_secret

pytestmark = pytest.mark.integration

REQUEST = pb.PredictRequest(model="kt", history=[pb.Interaction(question_id=100, skill_id=7, correct=1)],
                            candidates=[pb.Candidate(question_id=101)])
BODY = {"model": "kt", "history": [{"question_id": 100, "skill_id": 7, "correct": 1}],
        "candidates": [{"question_id": 101}]}


def start(repository, folder, **overrides) -> tuple[ThreadedGateway, dict[str, str]]:
    tokens = issue_all(folder / "keys.jsonl")
    settings = Settings(repository=repository, grpc_port=0, http_port=0, grace_period_s=0.5,
                        api_keys=folder / "keys.jsonl", **overrides)
    gw = ThreadedGateway(settings, backend=FakeBackend(), store=SqliteStore(folder / "sessions.sqlite3"),
                         keys=LearnerKeys(b"k" * 32)).start()
    return gw, tokens


def failures(http: httpx.Client) -> dict[tuple[str, str], float]:
    text = http.get("/metrics").text
    return {(t, r): float(v) for t, r, v in
            re.findall(r'^routerkt_auth_failures_total\{reason="(\w+)",transport="(\w+)"\} (\S+)$', text, re.M)
            for t, r in [(r, t)]}


def test_failures_are_counted_and_logged_with_peer_and_key_id_on_both_transports(handmade_repository, tmp_path,
                                                                                  caplog) -> None:
    caplog.set_level(logging.INFO, logger="routerkt.security")
    gw, tokens = start(handmade_repository, tmp_path, auth_failure_burst=0)
    secret = tokens["admin"].split(".", 1)[1]
    wrong = wrong_secret(tokens["admin"])
    try:
        with grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}") as channel, \
                httpx.Client(base_url=f"http://127.0.0.1:{gw.http_port}", timeout=10, trust_env=False) as http:
            stub = pb_grpc.KnowledgeTracingServiceStub(channel)
            assert code(lambda: stub.Predict(REQUEST, timeout=5)) is grpc.StatusCode.UNAUTHENTICATED
            assert code(lambda: stub.Predict(REQUEST, timeout=5, metadata=(("authorization", wrong),))) \
                is grpc.StatusCode.UNAUTHENTICATED
            assert code(lambda: stub.Predict(REQUEST, timeout=5, metadata=(("authorization", tokens["admin"]),))) \
                is grpc.StatusCode.UNAUTHENTICATED                                          # not "Bearer ..."
            denied = stub.ForgetLearner
            assert code(lambda: denied(pb.ForgetLearnerRequest(learner_id="l1"), timeout=5, metadata=(
                ("authorization", f"Bearer {tokens['predict']}"),))) is grpc.StatusCode.PERMISSION_DENIED
            assert http.post("/v1/predict", json=BODY).status_code == 401
            assert http.post("/v1/predict", json=BODY, headers={"authorization": wrong}).status_code == 401
            assert http.get("/v1/rollout", headers={"authorization": f"Bearer {tokens['observe']}"}).status_code == 403
            counted = failures(http)
            metrics_text = http.get("/metrics").text
    finally:
        gw.stop(0.5)
    assert counted == {("grpc", "missing"): 1, ("grpc", "invalid"): 1, ("grpc", "malformed"): 1,
                       ("grpc", "denied"): 1, ("http", "missing"): 1, ("http", "invalid"): 1, ("http", "denied"): 1}
    logged = [r.getMessage() for r in caplog.records if r.name == "routerkt.security"]
    forget = [m for m in logged if "ForgetLearner" in m]
    assert forget and "key id predict" in forget[0] and "from 127.0.0.1" in forget[0] and "lacking the scope" in forget[0]
    assert any("(http)" in m and "an invalid API key" in m and "key id admin" in m and "POST /v1/predict" in m
               for m in logged)
    assert any("(http)" in m and "key id observe" in m and "GET /v1/rollout" in m for m in logged)
    everything = "\n".join(logged) + metrics_text
    for token in tokens.values():
        assert token.split(".", 1)[1] not in everything and secret[1:] not in everything


def test_log_lines_are_bounded_and_the_limit_spares_valid_keys(handmade_repository, tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="routerkt.security")
    gw, tokens = start(handmade_repository, tmp_path, auth_failure_burst=5, auth_failure_per_s=0.01)
    secret = tokens["predict"].split(".", 1)[1]
    try:
        with grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}") as channel, \
                httpx.Client(base_url=f"http://127.0.0.1:{gw.http_port}", timeout=10, trust_env=False) as http:
            stub = pb_grpc.KnowledgeTracingServiceStub(channel)
            codes = [code(lambda i=i: stub.Predict(REQUEST, timeout=5, metadata=(
                ("authorization", f"Bearer predict.guess{i}{secret}"),))) for i in range(200)]
            assert codes[:5] == [grpc.StatusCode.UNAUTHENTICATED] * 5
            assert set(codes[5:]) == {grpc.StatusCode.RESOURCE_EXHAUSTED}
            # the same address with a valid key: answered at once, whatever its failures
            valid = (("authorization", f"Bearer {tokens['predict']}"),)
            assert [code(lambda: stub.Predict(REQUEST, timeout=5, metadata=valid)) for _ in range(20)] == \
                [grpc.StatusCode.OK] * 20
            over = http.post("/v1/predict", json=BODY, headers={"authorization": "Bearer predict.nope"})
            assert over.status_code == 429 and over.headers.get("retry-after") == "1"
            ok = http.post("/v1/predict", json=BODY, headers={"authorization": f"Bearer {tokens['predict']}"})
            assert ok.status_code == 200
            counted = failures(http)
    finally:
        gw.stop(0.5)
    assert counted[("grpc", "invalid")] == 5 and counted[("grpc", "limited")] == 195
    logged = [r.getMessage() for r in caplog.records if r.name == "routerkt.security"
              and r.getMessage().startswith("authentication failure (grpc)")]
    assert 2 <= len(logged) <= 10, logged          # 200 failures within seconds: a few lines, one per second at most


def test_http_checks_the_key_before_the_body(handmade_repository, tmp_path) -> None:
    gw, tokens = start(handmade_repository, tmp_path, auth_failure_burst=0, http_body_timeout_s=2.0)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{gw.http_port}", timeout=10, trust_env=False) as http:
            malformed = {"content-type": "application/json"}
            assert http.post("/v1/predict", content=b"{not json", headers=malformed).status_code == 401
            keyed = {**malformed, "authorization": f"Bearer {tokens['predict']}"}
            assert http.post("/v1/predict", content=b"{not json", headers=keyed).status_code == 400
            assert http.get("/no/such/path").status_code == 404                     # unknown paths as before
        # a body announced but never sent: without a key the answer comes at once (401), not after
        # the body's read timeout (408: what a keyed caller gets)
        for headers, status in (("", 401), (f"authorization: Bearer {tokens['predict']}\r\n", 408)):
            with socket.create_connection(("127.0.0.1", gw.http_port), timeout=15) as sock:
                sock.sendall(f"POST /v1/predict HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                             f"{headers}content-length: 100000\r\n\r\n{{".encode())
                started = time.monotonic()
                answer = sock.recv(4096).decode("latin-1")
            assert answer.startswith(f"HTTP/1.1 {status} "), answer
            assert (time.monotonic() - started < 1.0) == (status == 401)
    finally:
        gw.stop(0.5)


def test_token_buckets_refill_and_stay_bounded() -> None:
    from serving.security.failures import TokenBuckets
    now = [0.0]
    buckets = TokenBuckets(burst=3, per_s=1.0, clock=lambda: now[0], max_tracked=100)
    assert [buckets.take("a") for _ in range(4)] == [True, True, True, False]
    assert buckets.take("b")                                   # another name has its own budget
    now[0] += 1.0
    assert buckets.take("a") and not buckets.take("a")         # one token back after a second
    for i in range(1000):                                      # many names: forgotten once full again
        now[0] += 0.01
        buckets.take(f"peer-{i}")
    assert len(buckets) <= 101


UNKNOWN_KEY = {"authorization": "Bearer nosuch.secret"}          # names no key: only the peer's bucket


def security_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "routerkt.security"]


def test_x_forwarded_for_from_loopback_is_not_trusted_by_default(handmade_repository, tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="routerkt.security")
    gw, _ = start(handmade_repository, tmp_path, auth_failure_burst=5, auth_failure_per_s=0.01)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{gw.http_port}", timeout=10, trust_env=False) as http:
            statuses = [http.post("/v1/predict", json=BODY, headers={**UNKNOWN_KEY,
                                                                      "x-forwarded-for": f"198.51.100.{i}"}).status_code
                        for i in range(40)]
    finally:
        gw.stop(0.5)
    assert statuses == [401] * 5 + [429] * 35          # one address, one budget, whatever the header says
    logged = [m for m in security_lines(caplog) if m.startswith("authentication failure (http)")]
    assert logged and all("from 127.0.0.1," in m for m in logged), logged
    assert not any("198.51.100." in m for m in security_lines(caplog))


def test_x_forwarded_for_names_the_client_behind_a_trusted_proxy(handmade_repository, tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="routerkt.security")
    gw, _ = start(handmade_repository, tmp_path, auth_failure_burst=5, auth_failure_per_s=0.01,
                  trusted_proxies=("127.0.0.1",))
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{gw.http_port}", timeout=10, trust_env=False) as http:
            statuses = {client: [http.post("/v1/predict", json=BODY, headers={
                **UNKNOWN_KEY, "x-forwarded-for": f"{client}, 127.0.0.1"}).status_code for _ in range(7)]
                for client in ("198.51.100.7", "203.0.113.9")}
    finally:
        gw.stop(0.5)
    assert statuses == {client: [401] * 5 + [429] * 2 for client in ("198.51.100.7", "203.0.113.9")}
    assert any("from 198.51.100.7," in m for m in security_lines(caplog))


def test_caller_chosen_text_reaches_the_log_only_escaped(handmade_repository, tmp_path, caplog) -> None:
    """A forwarded address (from a trusted proxy, which passes on what the client sent) with C1
    controls (NEL is a line break to str.splitlines and many viewers, CSI starts a terminal escape)
    and a path with a newline and ESC: every log line stays one line of printable ASCII."""
    caplog.set_level(logging.INFO, logger="routerkt.security")
    gw, _ = start(handmade_repository, tmp_path, auth_failure_burst=0, trusted_proxies=("127.0.0.0/8",))
    forged = b"10.9.8.7\x85authentication ok from 10.0.0.1\x9b2J"
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{gw.http_port}", timeout=10, trust_env=False) as http:
            assert http.post("/v1/predict", json=BODY, headers={**UNKNOWN_KEY, "x-forwarded-for": forged}) \
                .status_code == 401
            assert http.put("/v1/rollout/kt%0aFAKE%1b[31m", json={}).status_code == 401
    finally:
        gw.stop(0.5)
    logged = security_lines(caplog)
    assert any("from 10.9.8.7\\x85authentication ok from 10.0.0.1\\x9b2J," in m for m in logged), logged
    assert any("calling PUT /v1/rollout/{model}" in m for m in logged), logged
    for line in logged:
        assert line.isascii() and line.isprintable() and "FAKE" not in line, line


def test_trusted_proxies_are_addresses_or_networks() -> None:
    from routerkt.errors import UserError
    settings = Settings(trusted_proxies="10.0.0.7, 10.1.0.0/16,fd00::/8").validate()
    assert settings.trusted_proxies == ("10.0.0.7", "10.1.0.0/16", "fd00::/8")
    assert settings.forwarded_allow_ips == ["10.0.0.7", "::ffff:a00:7", "10.1.0.0/16", "::ffff:a01:0/112",
                                            "fd00::/8"]
    for bad in ("proxy.local", "10.0.0.1/8", "10.0.0.7,,10.0.0.8", ("10.0.0.7", None)):
        with pytest.raises(UserError, match="^--trusted-proxies") as info:
            Settings(trusted_proxies=bad).validate()
        assert "\n" not in str(info.value)
