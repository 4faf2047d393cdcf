"""The sample client `routerkt serve --sample-model NAME` runs once the model is ready: one Predict over
real gRPC loopback with a made-up history (ids and each question's skill set from the model's
vocabulary: skill_ids where a question has several skills), printed; then, with a
session store, an Observe of the same history for a sample learner and a Predict by its learner id."""
from __future__ import annotations

import asyncio
import json
import logging
import time

import grpc
from google.protobuf import json_format

from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc

log = logging.getLogger("routerkt.serve")
SAMPLE_WAIT_S = 120.0          # how long the sample waits for the model to become ready


async def sample_prediction(server, model: str, api_key: str | None = None) -> None:
    """One Predict over real gRPC loopback with a made-up history; prints request and answer (sending
    `api_key` when the gateway needs one)."""
    deadline = time.monotonic() + SAMPLE_WAIT_S
    while not server.backend.ready_versions(model) and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    versions = server.catalog.versions(model)
    if not versions or not server.backend.ready_versions(model):
        log.error("sample prediction skipped: model %r is not ready (models ready: %s)", model,
                  server.backend.ready_models())
        return
    vocab = server.catalog.get(model, max(server.backend.ready_versions(model))).vocab
    questions = sorted(vocab.questions)[:8]
    history = [pb.Interaction(question_id=q, correct=i % 2, **skill_fields(vocab.question_skills.get(q, (-1,))))
               for i, q in enumerate(questions[:5])]
    request = pb.PredictRequest(model=model, history=history,
                                candidates=[pb.Candidate(question_id=q) for q in questions[5:]])
    host = "127.0.0.1" if server.settings.host in ("0.0.0.0", "::") else server.settings.host
    if server.settings.api_keys is not None and not api_key:
        log.error("sample prediction skipped: the gateway needs an API key (set ROUTERKT_API_KEY)")
        return
    metadata = (("authorization", f"Bearer {api_key}"),) if api_key else None
    async with grpc.aio.insecure_channel(f"{host}:{server.grpc_port}") as channel:
        stub = _Keyed(pb_grpc.KnowledgeTracingServiceStub(channel), metadata)
        try:
            response = await stub.Predict(request, timeout=10.0)
        except grpc.aio.AioRpcError as exc:
            log.error("sample prediction failed: %s: %s", exc.code().name, exc.details())
            return
        body = json_format.MessageToDict(request, preserving_proto_field_name=True,
                                         always_print_fields_with_no_presence=True)
        print("sample request: " + json.dumps(without_empty(body)), flush=True)
        pairs = ", ".join(f"question {c.question_id}: {p:.4f}"
                          for c, p in zip(request.candidates, response.probabilities))
        print(f"sample response: model {response.model} version {response.version}, "
              f"history_used {response.history_used}, P(correct) {pairs}", flush=True)
        if server.sessions is not None:
            await sample_session(stub, request, response)


class _Keyed:
    """A stub whose calls all carry `metadata` (the API key)."""

    def __init__(self, stub, metadata) -> None:
        self.stub, self.metadata = stub, metadata

    def __getattr__(self, name: str):
        method = getattr(self.stub, name)
        return lambda request, **kwargs: method(request, metadata=self.metadata, **kwargs)


def without_empty(value):
    """A JSON value without its empty lists and objects (unset repeated fields: `"skill_ids": []`);
    zeros stay (`"correct": 0` is an answer)."""
    if isinstance(value, dict):
        kept = {k: without_empty(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v not in ([], {})}
    if isinstance(value, list):
        return [without_empty(v) for v in value]
    return value


def skill_fields(skills: tuple[int, ...]) -> dict:
    """A question's recorded skill set as message fields: skill_id for one skill, skill_ids for more."""
    return {"skill_id": skills[0]} if len(skills) == 1 else {"skill_ids": list(skills)}


async def sample_session(stub, request, explicit) -> None:
    """Observe the sample history for a sample learner, then Predict by learner id (same answer)."""
    learner = "routerkt-sample-learner"
    try:
        await stub.ForgetLearner(pb.ForgetLearnerRequest(learner_id=learner), timeout=10.0)
        events = [pb.Event(event_id=f"sample-{i}", question_id=h.question_id, correct=h.correct,
                           **({"skill_ids": h.skill_ids} if h.skill_ids else {"skill_id": h.skill_id}))
                  for i, h in enumerate(request.history)]
        observed = await stub.Observe(pb.ObserveRequest(learner_id=learner, events=events), timeout=10.0)
        by_id = await stub.Predict(pb.PredictRequest(model=request.model, learner_id=learner,
                                                     candidates=request.candidates), timeout=10.0)
    except grpc.aio.AioRpcError as exc:
        log.error("sample session failed: %s: %s", exc.code().name, exc.details())
        return
    diff = max(abs(a - b) for a, b in zip(by_id.probabilities, explicit.probabilities))
    print(f"sample session: Observe stored {observed.stored} events (history_length {observed.history_length}); "
          f"Predict by learner_id: P(correct) {', '.join(f'{p:.4f}' for p in by_id.probabilities)} "
          f"(max |diff| to the explicit history: {diff:.1e})", flush=True)
