"""Small helpers shared by test modules (not fixtures)."""
from __future__ import annotations

import time

import pytest


def wait_for(predicate, timeout: float, what: str, step: float = 0.1):
    """Poll `predicate` until it returns a truthy value (returned) or fail the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def triton_answer(request, value: float = 0.5):
    """What a fake Triton answers to a ModelInferRequest: its first input's shape in FP32, `value`
    everywhere (for fakes standing in for the GRPCInferenceServiceStub of serving/backends/triton/triton_client.py)."""
    import numpy as np
    from tritonclient.grpc import service_pb2

    shape = list(request.inputs[0].shape)
    response = service_pb2.ModelInferResponse(model_name=request.model_name)
    response.outputs.add(name=request.outputs[0].name, datatype="FP32", shape=shape)
    response.raw_output_contents.append(np.full(shape, value, dtype=np.float32).tobytes())
    return response


def triton_rpc_error(status: str, message: str):
    """The error a Triton call raises: grpc.aio.AioRpcError with status name `status`."""
    import grpc

    return grpc.aio.AioRpcError(grpc.StatusCode[status], grpc.aio.Metadata(), grpc.aio.Metadata(), details=message)


def grpc_status(call):
    """The gRPC status code of `call()`: OK, or the code of the RpcError it raised."""
    import grpc

    try:
        call()
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        return exc.code()
