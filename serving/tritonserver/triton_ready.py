"""Whether a starting tritonserver is ready yet: its HTTP /v2/health/ready, or (HTTP off, gRPC on a
private socket) its gRPC ServerReady. serving/tritonserver/launcher.py polls one until it says so."""
from __future__ import annotations

import urllib.error
import urllib.request
from typing import Protocol


class ReadinessCheck(Protocol):
    def ready(self) -> bool:
        """True once the server says it is ready; False while it does not answer or is not ready."""

    def close(self) -> None:
        """Release what the check holds (a channel)."""


class HttpReadiness:
    """GET http://<address>/v2/health/ready answers 200 (never through a proxy)."""

    def __init__(self, address: str) -> None:
        self.url = f"http://{address}/v2/health/ready"
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def ready(self) -> bool:
        try:
            with self.opener.open(self.url, timeout=1.0) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def close(self) -> None:
        pass                          # one connection per request, closed with it


class GrpcReadiness:
    """Triton's gRPC ServerReady says ready, over one channel (`target`: HOST:PORT or unix:PATH)."""

    def __init__(self, target: str) -> None:
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        self._errors, self._request = grpc.RpcError, service_pb2.ServerReadyRequest()
        self._channel = grpc.insecure_channel(target, options=[   # the socket appears late: retry it fast
            ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 200)])
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    def ready(self) -> bool:
        try:
            return self._stub.ServerReady(self._request, timeout=1.0).ready
        except self._errors:
            return False

    def close(self) -> None:
        self._channel.close()
