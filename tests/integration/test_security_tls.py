"""TLS on the gateway's two ports with certificates made inside the test (openssl): a TLS client
predicts, a plaintext one fails, mTLS refuses a client certificate from another CA, and a renewed
certificate is served without a restart (both ports)."""
from __future__ import annotations

import os
import shutil
import ssl
from pathlib import Path

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
