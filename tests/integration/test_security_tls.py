"""TLS on the gateway's two ports with certificates made inside the test (openssl): a TLS client
predicts, a plaintext one fails, mTLS refuses a client certificate from another CA, a renewed
certificate is served without a restart, and a TLS session from before a client-CA switch is not
resumed after it (both ports)."""
from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import socket
import ssl
from pathlib import Path
from typing import Callable

import grpc
import httpx
import pytest

from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.client import connect
from serving.server import ThreadedGateway
from serving.settings import Settings
from tests.helpers import wait_for
from tests.integration.security_helpers import FakeBackend, der, make_ca, make_cert, served_certificate

pytestmark = pytest.mark.integration

REQUEST = pb.PredictRequest(model="kt", history=[pb.Interaction(question_id=100, skill_id=7, correct=1)],
                            candidates=[pb.Candidate(question_id=101)])
BODY = {"model": "kt", "history": [{"question_id": 100, "skill_id": 7, "correct": 1}],
        "candidates": [{"question_id": 101}]}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pki")
    ca, other = make_ca(folder, "ca"), make_ca(folder, "other-ca")
    return {"ca": ca, "other_ca": other, "server": make_cert(folder, ca, "server"),
            "renewed": make_cert(folder, ca, "server-renewed"), "client": make_cert(folder, ca, "client", client=True),
            "stranger": make_cert(folder, other, "stranger", client=True), "folder": folder}


def client_context(ca, client=None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca.cert))
    if client is not None:
        context.load_cert_chain(client.cert, client.key)
    return context


def start(repository: Path, **security) -> ThreadedGateway:
    settings = Settings(repository=repository, grpc_port=0, http_port=0, grace_period_s=0.5, **security)
    return ThreadedGateway(settings, backend=FakeBackend()).start()


def predict(port: int, ca, client=None) -> pb.PredictResponse:
    pair = (client.key.read_bytes(), client.cert.read_bytes()) if client else None
    with connect(f"localhost:{port}", tls_ca=ca.cert.read_bytes(), client_cert=pair) as channel:
        return pb_grpc.KnowledgeTracingServiceStub(channel).Predict(REQUEST, timeout=10)


def test_tls_client_predicts_and_a_plaintext_client_fails(handmade_repository, pki) -> None:
    gw = start(handmade_repository, tls_cert=pki["server"].cert, tls_key=pki["server"].key)
    try:
        assert predict(gw.grpc_port, pki["ca"]).model == "kt"
        with httpx.Client(verify=client_context(pki["ca"]), trust_env=False) as http:
            answer = http.post(f"https://localhost:{gw.http_port}/v1/predict", json=BODY)
        assert answer.status_code == 200 and answer.json()["model"] == "kt"
        with grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}") as channel:
            with pytest.raises(grpc.RpcError) as info:
                pb_grpc.KnowledgeTracingServiceStub(channel).Predict(REQUEST, timeout=3)
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE
        with pytest.raises(httpx.TransportError), httpx.Client(trust_env=False) as http:
            http.post(f"http://127.0.0.1:{gw.http_port}/v1/predict", json=BODY, timeout=3)
    finally:
        gw.stop(0.5)


def test_mtls_refuses_a_client_certificate_from_another_ca(handmade_repository, pki) -> None:
    gw = start(handmade_repository, tls_cert=pki["server"].cert, tls_key=pki["server"].key,
               tls_client_ca=pki["ca"].cert)
    try:
        assert predict(gw.grpc_port, pki["ca"], pki["client"]).model == "kt"
        for client in (pki["stranger"], None):
            with pytest.raises(grpc.RpcError) as info:
                predict(gw.grpc_port, pki["ca"], client)
            assert info.value.code() is grpc.StatusCode.UNAVAILABLE
        url = f"https://localhost:{gw.http_port}/v1/predict"
        with httpx.Client(verify=client_context(pki["ca"], pki["client"]), trust_env=False) as http:
            assert http.post(url, json=BODY).status_code == 200
        for client in (pki["stranger"], None):
            with pytest.raises((httpx.TransportError, ssl.SSLError)), \
                    httpx.Client(verify=client_context(pki["ca"], client), trust_env=False) as http:
                http.post(url, json=BODY, timeout=3)
    finally:
        gw.stop(0.5)


def test_a_renewed_certificate_is_served_without_restart(handmade_repository, pki, tmp_path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(pki["server"].cert, cert)
    shutil.copy(pki["server"].key, key)
    gw = start(handmade_repository, tls_cert=cert, tls_key=key)
    try:
        for port in (gw.grpc_port, gw.http_port):
            assert served_certificate(port) == der(pki["server"].cert)
        for source, target in ((pki["renewed"].key, key), (pki["renewed"].cert, cert)):   # as cert-manager does
            shutil.copy(source, target.with_suffix(".new"))
            os.replace(target.with_suffix(".new"), target)
        for port in (gw.grpc_port, gw.http_port):
            wait_for(lambda: served_certificate(port) == der(pki["renewed"].cert), 10, f"the renewed certificate on {port}")
        assert predict(gw.grpc_port, pki["ca"]).model == "kt"
    finally:
        gw.stop(0.5)


def test_a_client_ca_removed_from_the_file_is_refused_after_reload_on_both_ports(handmade_repository, pki,
                                                                                 tmp_path) -> None:
    """A CA rotation replaces the trust store (a fresh one per reload), it does not add to it."""
    bundle = tmp_path / "client-ca.pem"
    bundle.write_text(pki["ca"].cert.read_text() + pki["other_ca"].cert.read_text())
    gw = start(handmade_repository, tls_cert=pki["server"].cert, tls_key=pki["server"].key, tls_client_ca=bundle)
    url = f"https://localhost:{gw.http_port}/v1/predict"

    def http_ok(client) -> bool:
        try:
            with httpx.Client(verify=client_context(pki["ca"], client), trust_env=False) as http:
                return http.post(url, json=BODY, timeout=3).status_code == 200
        except (httpx.TransportError, ssl.SSLError):
            return False

    def grpc_ok(client) -> bool:
        try:
            return predict(gw.grpc_port, pki["ca"], client).model == "kt"
        except grpc.RpcError:
            return False

    try:
        for client in (pki["client"], pki["stranger"]):           # both CAs trusted at first
            assert grpc_ok(client) and http_ok(client)
        shutil.copy(pki["ca"].cert, bundle.with_suffix(".new"))   # the other CA leaves the file
        os.replace(bundle.with_suffix(".new"), bundle)
        wait_for(lambda: not grpc_ok(pki["stranger"]), 10, "gRPC to refuse the removed CA's client")
        wait_for(lambda: not http_ok(pki["stranger"]), 10, "HTTP to refuse the removed CA's client")
        assert grpc_ok(pki["client"]) and http_ok(pki["client"])  # the remaining CA's clients still pass
        assert served_certificate(gw.http_port) == der(pki["server"].cert)
    finally:
        gw.stop(0.5)


H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])     # + an empty SETTINGS


def http_predict_over(sock: ssl.SSLSocket) -> bool:
    """POST /v1/predict on an open TLS socket: True when answered 200 with a prediction."""
    body = json.dumps(BODY).encode()
    sock.sendall(b"POST /v1/predict HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n" % len(body) + body)
    answer = http.client.HTTPResponse(sock)
    answer.begin()
    return answer.status == 200 and json.loads(answer.read())["model"] == "kt"


def grpc_settings_over(sock: ssl.SSLSocket) -> bool:
    """The HTTP/2 preface on an open TLS socket: True when the gRPC server answers its SETTINGS (it took
    the connection)."""
    sock.sendall(H2_PREFACE)
    frame = sock.recv(9)
    return len(frame) == 9 and frame[3] == 4


def tls_exchange(port: int, context: ssl.SSLContext, talk: Callable[[ssl.SSLSocket], bool],
                 session: ssl.SSLSession | None = None) -> tuple[bool, ssl.SSLSession | None, bool]:
    """One connection offering `session`: (whether `talk` got through, the session to offer next,
    whether this one was resumed). Ends with a clean TLS shutdown, so that the server keeps the
    session (OpenSSL drops the session of a connection closed without one)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        try:
            sock = context.wrap_socket(raw, server_hostname="localhost", session=session)
            through = talk(sock)
        except (ssl.SSLError, OSError, http.client.HTTPException):
            return False, None, False
        state = (through, sock.session, sock.session_reused)
        with contextlib.suppress(ssl.SSLError, OSError):
            sock.unwrap()
        return state


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3], ids=["tls1.2", "tls1.3"])
def test_a_session_from_before_a_client_ca_switch_is_not_resumed_after_it(handmade_repository, pki, tmp_path,
                                                                          version) -> None:
    """A resumed session skips the client certificate's check: one saved under CA A (a TLS 1.2 session
    id or a TLS 1.3 ticket) must not pass once the --tls-client-ca file names CA B only."""
    client_ca = tmp_path / "client-ca.pem"
    shutil.copy(pki["ca"].cert, client_ca)
    gw = start(handmade_repository, tls_cert=pki["server"].cert, tls_key=pki["server"].key, tls_client_ca=client_ca)
    ports = {"gRPC": (gw.grpc_port, "h2", grpc_settings_over), "HTTP": (gw.http_port, "http/1.1", http_predict_over)}
    contexts, saved, resumed = {}, {}, {}
    try:
        for name, (port, alpn, talk) in ports.items():
            contexts[name] = context = client_context(pki["ca"], pki["client"])
            context.minimum_version = context.maximum_version = version
            context.set_alpn_protocols([alpn])
            through, session, _ = tls_exchange(port, context, talk)
            assert through and session is not None, name
            through, again, resumed[name] = tls_exchange(port, context, talk, session)
            assert through, name
            saved[name] = again if again is not None else session
        assert resumed == {"gRPC": True, "HTTP": True}      # within one load both resume: the test would see it
        shutil.copy(pki["other_ca"].cert, client_ca.with_suffix(".new"))       # CA B replaces CA A
        os.replace(client_ca.with_suffix(".new"), client_ca)
        for name, (port, _, talk) in ports.items():
            context = contexts[name]
            wait_for(lambda: not tls_exchange(port, context, talk)[0], 10, f"{name} to refuse CA A's client")
            through, _, reused = tls_exchange(port, context, talk, saved[name])
            assert not through and not reused, f"{name} resumed a session from before the switch"
    finally:
        gw.stop(0.5)
