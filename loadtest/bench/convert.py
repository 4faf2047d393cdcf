"""`routerkt bench convert`: the gateway's two per-call conversions beside their alternatives, in one run.

The conversions, each side by side with its alternatives:

1. request -> arrays (serving/transport/grpc_api.py), history sent as `repeated Interaction` messages vs as
   `HistoryColumns`: one Predict (99-interaction history, 1 candidate) and one maximal PredictBatch
   (64 learners x 1,000 interactions x 64 candidates); median ms of each form, their ratio and the
   encoded sizes. Parsing the bytes (protobuf's C code) is not included: both forms share it.
2. arrays -> the Triton request of one rank inference (1 row, history 99, 1 candidate):
   tritonclient's InferInput objects and request builder (what the gateway used before) vs the
   request prepared once per model version (serving/backends/triton/triton_client.py); median us each.

    routerkt bench convert [--repeats 200]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from routerkt.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=int, default=200, help="conversions per request (the maximal batch: a tenth)")


def _median_ms(convert, repeats: int) -> float:
    convert()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        convert()
        times.append(time.perf_counter() - started)
    return float(np.median(times)) * 1e3


def requests(history: int, learners: int, candidates: int, batch: bool):
    """(messages form, columns form) of the same request, parsed back from their bytes."""
    from serving.api import knowledge_tracing_pb2 as pb
    questions, correct = [i % 200 for i in range(history)], [i % 2 for i in range(history)]
    messages = [pb.Interaction(question_id=q, correct=c) for q, c in zip(questions, correct)]
    columns = pb.HistoryColumns(question_ids=questions, correct=correct)
    asked = [pb.Candidate(question_id=j) for j in range(candidates)]
    if batch:
        build = [pb.PredictBatchRequest(model="m", learners=[pb.LearnerRequest(**form, candidates=asked)] * learners)
                 for form in ({"history": messages}, {"history_columns": columns})]
    else:
        build = [pb.PredictRequest(model="m", candidates=asked, **form)
                 for form in ({"history": messages}, {"history_columns": columns})]
    return [type(r).FromString(r.SerializeToString()) for r in build]


def triton_requests():
    """(tritonclient's way, the prepared way) of building the Triton request of one rank inference."""
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc._utils import _get_inference_request

    from routerkt.contract.signature import RANK
    from serving.metrics import Metrics
    from serving.backends.triton.triton_client import TritonClient
    feeds = {spec.name: np.ones((1, 99 if spec.name.startswith("history") else 1), dtype=np.int64)
             for spec in RANK.inputs}
    client = TritonClient("127.0.0.1:1", Metrics())

    def tritonclient_way():
        inputs = []
        for spec in RANK.inputs:
            tensor = grpcclient.InferInput(spec.name, list(feeds[spec.name].shape), spec.onnx_dtype)
            tensor.set_data_from_numpy(np.ascontiguousarray(feeds[spec.name], dtype=spec.dtype))
            inputs.append(tensor)
        return _get_inference_request(model_name="m", inputs=inputs, model_version="1", request_id="",
                                      outputs=[grpcclient.InferRequestedOutput(RANK.outputs[0].name)],
                                      sequence_id=0, sequence_start=False, sequence_end=False, priority=0,
                                      timeout=None, parameters=None)

    def prepared_way():
        return client.request("m", 1, RANK, feeds)
    return tritonclient_way, prepared_way


def run(args: argparse.Namespace) -> int:
    from serving.transport.grpc_api import batch_query, predict_query
    if args.repeats < 1:
        raise UserError("--repeats must be >= 1")
    print("| request | Interaction messages ms | HistoryColumns ms | ratio | bytes (messages / columns) |")
    print("|---|---|---|---|---|")
    cases = (("Predict, history 99, 1 candidate", (99, 1, 1), False, args.repeats),
             ("PredictBatch 64 x 1,000 x 64", (1000, 64, 64), True, max(1, args.repeats // 10)))
    for label, shape, batch, repeats in cases:
        convert = batch_query if batch else predict_query
        messages, columns = requests(*shape, batch=batch)
        messages_ms, columns_ms = (_median_ms(lambda r=r: convert(r), repeats) for r in (messages, columns))
        print(f"| {label} | {messages_ms:.3f} | {columns_ms:.3f} | {messages_ms / columns_ms:.1f}x | "
              f"{messages.ByteSize():,} / {columns.ByteSize():,} |")
    old, new = triton_requests()
    if old().SerializeToString() != new().SerializeToString():
        raise RuntimeError("the prepared Triton request differs from tritonclient's")
    old_us, new_us = (_median_ms(build, args.repeats * 10) * 1e3 for build in (old, new))
    print("\n| Triton request of one rank inference | tritonclient us | prepared us | ratio |")
    print("|---|---|---|---|")
    print(f"| 1 row, history 99, 1 candidate (identical bytes) | {old_us:.1f} | {new_us:.1f} | "
          f"{old_us / new_us:.1f}x |")
    return 0
