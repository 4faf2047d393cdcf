"""TLS between the gateway and Triton (docs/security.md): a real tritonserver serving gRPC with TLS
on 127.0.0.1 (certificates made in the test), and the real gateway over it with
settings.triton_tls_* (`routerkt serve --triton-tls-*`). A Predict works over TLS, and over mutual
TLS with the gateway's client certificate; Triton refuses a plaintext client, and with mutual TLS a
client without a certificate or with one of another CA; a gateway without the TLS settings never
reaches it."""
from __future__ import annotations

import contextlib
import time
from pathlib import Path

import grpc
import pytest
from tritonclient.grpc import service_pb2 as tpb
from tritonclient.grpc import service_pb2_grpc as tpb_grpc

from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.server import ThreadedGateway
from serving.settings import Settings
from serving.tritonserver.launcher import TritonServer
from tests.integration.security_helpers import make_ca, make_cert

pytestmark = pytest.mark.e2e

REQUEST = pb.PredictRequest(model="kt", history=[pb.Interaction(question_id=1, skill_id=1, correct=1)],
                            candidates=[pb.Candidate(question_id=2)])


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    folder = tmp_path_factory.mktemp("triton-pki")
    ca, other = make_ca(folder, "ca"), make_ca(folder, "other-ca")
    return {"ca": ca, "triton": make_cert(folder, ca, "triton"), "gateway": make_cert(folder, ca, "gateway", client=True),
            "stranger": make_cert(folder, other, "stranger", client=True)}


@contextlib.contextmanager
def tls_triton(repository: Path, folder: Path, pki: dict, mutual: bool):
    """A tritonserver whose gRPC speaks TLS (mutual: client certificates of pki's CA required), the
    flags as in serving/deploy/k8s/triton.yaml."""
    args = ["--grpc-use-ssl=true", f"--grpc-server-cert={pki['triton'].cert}",
            f"--grpc-server-key={pki['triton'].key}", f"--grpc-root-cert={pki['ca'].cert}"]
    if mutual:
        args.append("--grpc-use-ssl-mutual=true")
    server = TritonServer(repository, log_path=folder / "triton.log", exit_timeout_s=3, extra_args=args)
    server.start(timeout=120)
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def gateway(repository: Path, triton_url: str, **tls):
    settings = Settings(repository=repository, triton_url=triton_url, grpc_port=0, http_port=None,
                        probe_interval_s=0.5, probe_timeout_s=5.0, grace_period_s=0.5, **tls)
    gw = ThreadedGateway(settings).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}")
    try:
        yield pb_grpc.KnowledgeTracingServiceStub(channel)
    finally:
        channel.close()
        gw.stop(grace=0.5)


def predict_within(stub, seconds: float) -> pb.PredictResponse | grpc.RpcError:
    """The first Predict that succeeds within `seconds`, or the last error."""
    deadline, error = time.monotonic() + seconds, None
    while time.monotonic() < deadline:
        try:
            return stub.Predict(REQUEST, timeout=5)
        except grpc.RpcError as exc:
            error = exc
            time.sleep(0.25)
    return error


def refused(channel: grpc.Channel) -> grpc.StatusCode:
    """The status Triton's ServerLive gets over `channel` (fails the test when it is answered)."""
    with pytest.raises(grpc.RpcError) as info:
        tpb_grpc.GRPCInferenceServiceStub(channel).ServerLive(tpb.ServerLiveRequest(), timeout=3)
    return info.value.code()


def tls_channel(url: str, ca: Path, client=None) -> grpc.Channel:
    pair = {} if client is None else {"private_key": client.key.read_bytes(),
                                      "certificate_chain": client.cert.read_bytes()}
    return grpc.secure_channel(url, grpc.ssl_channel_credentials(root_certificates=ca.read_bytes(), **pair))


def test_gateway_predicts_over_tls_and_triton_refuses_plaintext(kt_repository, pki, tmp_path) -> None:
    with tls_triton(kt_repository.path, tmp_path, pki, mutual=False) as triton:
        url = triton.grpc_url
        with grpc.insecure_channel(url) as channel:
            assert refused(channel) is grpc.StatusCode.UNAVAILABLE
        with tls_channel(url, pki["ca"].cert) as channel:        # a TLS client of the CA is answered
            assert tpb_grpc.GRPCInferenceServiceStub(channel).ServerLive(tpb.ServerLiveRequest(), timeout=5).live
        with gateway(kt_repository.path, url, triton_tls_ca=pki["ca"].cert) as stub:
            answer = predict_within(stub, 90)
            assert isinstance(answer, pb.PredictResponse), answer
            assert len(answer.probabilities) == 1 and 0.0 < answer.probabilities[0] < 1.0
        with gateway(kt_repository.path, url) as stub:            # plaintext gateway: never ready
            error = predict_within(stub, 3)
            assert isinstance(error, grpc.RpcError) and error.code() is grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_needs_the_gateways_client_certificate(kt_repository, pki, tmp_path) -> None:
    with tls_triton(kt_repository.path, tmp_path, pki, mutual=True) as triton:
        url = triton.grpc_url
        with grpc.insecure_channel(url) as channel:
            assert refused(channel) is grpc.StatusCode.UNAVAILABLE
        for client in (None, pki["stranger"]):                     # no certificate, or one of another CA
            with tls_channel(url, pki["ca"].cert, client) as channel:
                assert refused(channel) is grpc.StatusCode.UNAVAILABLE
        with gateway(kt_repository.path, url, triton_tls_ca=pki["ca"].cert, triton_tls_cert=pki["gateway"].cert,
                     triton_tls_key=pki["gateway"].key) as stub:
            answer = predict_within(stub, 90)
            assert isinstance(answer, pb.PredictResponse), answer
            assert len(answer.probabilities) == 1
        with gateway(kt_repository.path, url, triton_tls_ca=pki["ca"].cert) as stub:   # TLS, no client cert
            error = predict_within(stub, 3)
            assert isinstance(error, grpc.RpcError) and error.code() is grpc.StatusCode.UNAVAILABLE
