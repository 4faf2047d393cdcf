"""The do-nothing server: the gateway's KnowledgeTracingService on grpc.aio whose calls do no work (the
ceiling of `routerkt bench ceiling`). Predict answers 0.5 per candidate, Observe stores nothing.

    python -m loadtest.null_server --port PORT
"""
from __future__ import annotations

import argparse
import asyncio

import grpc

from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc


class NullService(pb_grpc.KnowledgeTracingServiceServicer):
    """Every answer built from the request alone, as small as the gateway's."""

    async def Predict(self, request: pb.PredictRequest, context) -> pb.PredictResponse:
        return pb.PredictResponse(probabilities=[0.5] * len(request.candidates), model=request.model, version=1,
                                  history_used=len(request.history))

    async def Observe(self, request: pb.ObserveRequest, context) -> pb.ObserveResponse:
        return pb.ObserveResponse(stored=len(request.events), duplicates=0, history_length=len(request.events))


async def serve(port: int) -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    pb_grpc.add_KnowledgeTracingServiceServicer_to_server(NullService(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    asyncio.run(serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
