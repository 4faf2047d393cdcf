"""The calls of one simulated day of `routerkt bench loop`: Predict (served, static v1) and Observe per answer.

Each learner's answers go in order, `callers` learners at a time over gRPC aio: Predict by learner_id on
the served gateway and, with the learner's explicit history (Histories), of version 1 on the static v1
arm, then Observe of the answer. What was asked and answered is recorded in a DayCalls.
"""
from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

from loadtest.replay_days import Answer

CALL_TIMEOUT_S = 30.0


@dataclass
class DayCalls:
    """The calls of one day: per answer predicted on both sides, the answer, the served probability and
    the version that gave it, static v1's probability; calls and failures per RPC, the first errors."""
    correct: list[int] = field(default_factory=list)
    served: list[float] = field(default_factory=list)
    version: list[int] = field(default_factory=list)
    static: list[float] = field(default_factory=list)
    calls: Counter = field(default_factory=Counter)
    failed: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)


class Histories:
    """Each learner's events as the store holds them (oldest first), as pb.Interaction messages."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.events: dict[str, list] = {}

    def add(self, answer: Answer) -> None:
        from serving.api import knowledge_tracing_pb2 as pb
        self.events.setdefault(answer.learner, []).append(
            pb.Interaction(question_id=answer.question, skill_ids=answer.skills, correct=answer.correct))

    def recent(self, learner: str) -> list:
        """The newest `window` events: the gateway's encoder keeps window - 1 of them either way."""
        return self.events.get(learner, [])[-self.window:]


def _event(answer: Answer):
    from serving.api import knowledge_tracing_pb2 as pb
    return pb.Event(event_id=answer.event_id, question_id=answer.question, skill_ids=answer.skills,
                    correct=answer.correct, timestamp_ms=answer.timestamp_ms)


async def _call(calls: DayCalls, name: str, coroutine):
    import grpc
    calls.calls[name] += 1
    try:
        return await coroutine
    except grpc.RpcError as exc:
        calls.failed[name] += 1
        if len(calls.errors) < 20:
            calls.errors.append(f"{name}: {exc.code().name} {str(exc.details())[:200]}")
        return None


async def replay_day(served: str, static: str, model: str, day: list[list[Answer]], histories: Histories,
                     callers: int, predict: bool = True) -> DayCalls:
    """Every learner's answers of `day`, `callers` learners at a time: Predict of `model` (served, static v1)
    and Observe per answer in order; with `predict` False only the Observe calls (day 0: v1's training day)."""
    import grpc

    from serving.api import knowledge_tracing_pb2 as pb
    from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
    options = [("grpc.enable_http_proxy", 0)]
    calls = DayCalls()
    queue: asyncio.Queue = asyncio.Queue()
    for answers in day:
        queue.put_nowait(answers)
    async with grpc.aio.insecure_channel(served, options=options) as served_channel, \
            grpc.aio.insecure_channel(static, options=options) as static_channel:
        gateway, frozen = pb_grpc.KnowledgeTracingServiceStub(served_channel), \
            pb_grpc.KnowledgeTracingServiceStub(static_channel)

        async def learner(answers: list[Answer]) -> None:
            if not predict:
                for start in range(0, len(answers), 1000):
                    await _call(calls, "Observe", gateway.Observe(pb.ObserveRequest(
                        learner_id=answers[0].learner, events=[_event(a) for a in answers[start:start + 1000]]),
                        timeout=CALL_TIMEOUT_S))
                for answer in answers:
                    histories.add(answer)
                return
            for answer in answers:
                candidate = pb.Candidate(question_id=answer.question, skill_ids=answer.skills)
                got, base = await asyncio.gather(
                    _call(calls, "Predict", gateway.Predict(pb.PredictRequest(
                        model=model, learner_id=answer.learner, candidates=[candidate]), timeout=CALL_TIMEOUT_S)),
                    _call(calls, "static Predict", frozen.Predict(pb.PredictRequest(
                        model=model, version=1, history=histories.recent(answer.learner), candidates=[candidate]),
                        timeout=CALL_TIMEOUT_S)))
                await _call(calls, "Observe", gateway.Observe(pb.ObserveRequest(
                    learner_id=answer.learner, events=[_event(answer)]), timeout=CALL_TIMEOUT_S))
                histories.add(answer)
                if got is not None and base is not None:
                    calls.correct.append(answer.correct)
                    calls.served.append(float(got.probabilities[0]))
                    calls.version.append(int(got.version))
                    calls.static.append(float(base.probabilities[0]))

        async def caller() -> None:
            while True:
                try:
                    answers = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                await learner(answers)
        await asyncio.gather(*(caller() for _ in range(callers)))
    return calls
