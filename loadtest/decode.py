"""`routerkt bench decode`: what the gateway pays to turn a request into arrays, history sent as
`repeated Interaction` messages vs as `HistoryColumns`, in one run (ratios side by side).

    routerkt bench decode [--repeats 200]

Times serving/grpc_api.py's conversion (the gateway's own code) of parsed requests: one Predict
(99-interaction history, 1 candidate) and one maximal PredictBatch (64 learners x 1,000
interactions x 64 candidates). Prints the median milliseconds of each form, their ratio and the
encoded request sizes. Parsing the bytes (protobuf's C code) is not included: both forms share it.
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


def run(args: argparse.Namespace) -> int:
    from serving.grpc_api import batch_query, predict_query
    if args.repeats < 1:
        raise UserError("--repeats must be >= 1")
    print("| request | Interaction messages ms | HistoryColumns ms | ratio | bytes (messages / columns) |")
    print("|---|---|---|---|---|")
    for label, shape, batch, repeats in (("Predict, history 99, 1 candidate", (99, 1, 1), False, args.repeats),
                                         ("PredictBatch 64 x 1,000 x 64", (1000, 64, 64), True, max(1, args.repeats // 10))):
        convert = batch_query if batch else predict_query
        messages, columns = requests(*shape, batch=batch)
        a, b = (_median_ms(lambda r=r: convert(r), repeats) for r in (messages, columns))
        print(f"| {label} | {a:.3f} | {b:.3f} | {a / b:.1f}x | {messages.ByteSize():,} / {columns.ByteSize():,} |")
    return 0
