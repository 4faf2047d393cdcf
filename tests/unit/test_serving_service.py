"""serving/models.py (registry over a hand-made repository) and serving/pipeline/prediction.py with a FAKE
backend standing in for Triton: version resolution, NOT_FOUND / UNAVAILABLE, in-flight limit,
deadlines, error mapping without leaking Triton's text, batch packing, metrics."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from routerkt.contract import signature
from routerkt.contract.model_info import ModelInfo
from export.repository import publish_version
from export.triton_config import PARAM_N_QUESTIONS, PARAM_N_SKILLS, TritonModelOptions, render_config
from serving.status_errors import ServingError
from serving.metrics import Metrics
from serving.api import knowledge_tracing_pb2 as pb
from serving.core.catalog import ModelCatalog
from serving.encoder.window import WindowEncoder
from serving.transport.grpc_api import batch_query, batch_response, predict_query, predict_response
from serving.sessions.history import RequestHistory
from serving.metrics.sink import MetricsSink
from serving.pipeline.parts import BackendError, FailureKind
from serving.core.calls import Deadline
from serving.pipeline.prediction import PredictionService
from serving.settings import Settings
from serving.core.validation import validate_query
from serving.rollout.kinds.latest import LatestReadyVersion
from routerkt.contract.vocab import Vocab

pytestmark = pytest.mark.unit

VOCAB = Vocab(questions={100: 2, 101: 3, 102: 4}, skills={7: 2, 8: 3}, question_skill={100: 7, 101: 8, 102: 7})


def write_version(repo: Path, name: str, version: int, window: int = 5, max_batch_size: int = 1024,
                  vocab: Vocab = VOCAB) -> None:
    options = TritonModelOptions(window=window, max_batch_size=max_batch_size, preferred_batch_sizes=[1],
                                 parameters={PARAM_N_QUESTIONS: str(vocab.n_questions),
                                             PARAM_N_SKILLS: str(vocab.n_skills)})
    files = {signature.VOCAB_FILE: json.dumps(vocab.to_json()).encode(),
             signature.INFO_FILE: ModelInfo(name=name, window=window).save_bytes(), "model.py": b"# not run here\n"}
    publish_version(repo, name, files, render_config(name, options), version=version)


class FakeBackend:
    """Answers like the model would: probs[:, t] = question id at t / 100. Records requests."""

    def __init__(self) -> None:
        self.triton_ready = True
        self.ready: dict[str, set[int]] = {}
        self.reloading: set[str] = set()
        self.calls: list[tuple[str, int, np.ndarray, float]] = []
        self.fail: BackendError | None = None
        self.delay = 0.0
        self.running = self.max_concurrent = 0

    def ready_versions(self, model: str) -> frozenset[int]:
        return frozenset(self.ready.get(model, set())) if self.triton_ready else frozenset()

    def unavailable_reason(self, model: str) -> str | None:
        if model in self.reloading:
            return "reloading"
        return None if self.triton_ready else "down"

    async def infer(self, model, feeds, timeout_s):
        questions = feeds["questions"]                          # the handmade versions serve the score graph
        self.calls.append((model.name, model.version, questions.copy(), timeout_s))
        self.running += 1
        self.max_concurrent = max(self.max_concurrent, self.running)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
        finally:
            self.running -= 1
        if self.fail is not None:
            raise self.fail
        return questions.astype(np.float32) / 100.0

    def holds_states(self, model) -> bool:
        return False

    def steps(self, model) -> bool:
        return False

    async def infer_step(self, model, graph, feeds, timeout_s):
        raise AssertionError("no step graphs here")

    async def infer_outputs(self, model, feeds, outputs, timeout_s):
        """Every named output is what `infer` answers (the handmade versions have no explain graph)."""
        probs = await self.infer(model, feeds, timeout_s)
        return {name: probs for name in outputs}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    write_version(repo, "kt", 1)
    write_version(repo, "kt", 2)
    write_version(repo, "small", 1, max_batch_size=3)       # config.pbtxt (max_batch_size) is per model
    return repo


@pytest.fixture
def setup(repo: Path):
    settings = Settings(repository=repo, max_candidates=3, max_rows_per_infer=4, max_inflight=2).validate()
    registry = ModelCatalog(repo)
    registry.refresh()
    backend = FakeBackend()
    backend.ready = {"kt": {1, 2}}
    metrics = Metrics()
    service = PredictionService(settings, registry, backend, metrics, history=RequestHistory(),
                                policy=LatestReadyVersion(), encoder=WindowEncoder(), sink=MetricsSink(metrics))
    return ProtoFacade(service), backend, metrics


class ProtoFacade:
    """The transport-independent service behind the gRPC adapter's message conversions."""

    def __init__(self, service: PredictionService) -> None:
        self.service, self.settings = service, service.settings

    async def predict(self, request: pb.PredictRequest, deadline: Deadline) -> pb.PredictResponse:
        return predict_response(await self.service.predict(predict_query(request), deadline))

    async def predict_batch(self, request: pb.PredictBatchRequest, deadline: Deadline) -> pb.PredictBatchResponse:
        return batch_response(await self.service.predict(batch_query(request), deadline))


def predict_request(candidates=(100, 101), history=((100, 7, 1),), model="kt", version=0) -> pb.PredictRequest:
    return pb.PredictRequest(model=model, version=version,
                             history=[pb.Interaction(question_id=q, skill_id=s, correct=c) for q, s, c in history],
                             candidates=[pb.Candidate(question_id=q) for q in candidates])


def run(coro):
    return asyncio.run(coro)


def code_of(coro) -> ServingError:
    with pytest.raises(ServingError) as info:
        run(coro)
    return info.value


# -- registry -------------------------------------------------------------------------------------
def test_registry_reads_versions_and_picks_up_new_ones(repo: Path) -> None:
    registry = ModelCatalog(repo)
    result = registry.refresh()
    assert result.added == (("kt", 1), ("kt", 2), ("small", 1)) and registry.models() == ["kt", "small"]
    assert registry.get("kt", 1).window == 5 and registry.get("small", 1).max_batch_size == 3
    assert registry.get("kt", 1).vocab.questions == VOCAB.questions
    write_version(repo, "kt", 3)
    write_version(repo, "other", 1, window=7)
    result = registry.refresh()
    assert result.added == (("kt", 3), ("other", 1)) and result.removed == ()
    assert registry.get("other", 1).window == 7
    assert registry.refresh().added == ()                # nothing changed: nothing re-read


def test_registry_refuses_a_window_that_contradicts_the_config(repo: Path) -> None:
    write_version(repo, "kt", 3, window=9)                # rewrites the model's config.pbtxt to dims [9]
    registry = ModelCatalog(repo)
    registry.refresh()
    assert registry.versions("kt") == [3]                 # versions 1, 2 (window 5) no longer fit


def test_registry_skips_broken_versions_until_fixed(repo: Path) -> None:
    write_version(repo, "kt", 3)
    vocab_path = repo / "kt" / "3" / signature.VOCAB_FILE
    vocab_path.write_text("{not json")
    registry = ModelCatalog(repo)
    registry.refresh()
    assert registry.versions("kt") == [1, 2]
    vocab_path.write_text(json.dumps(VOCAB.to_json()))
    os.utime(vocab_path, ns=(1, 10**18))                  # make sure the stamp changes
    assert registry.refresh().added == (("kt", 3),)


def test_registry_not_found_names_model_or_version(repo: Path) -> None:
    registry = ModelCatalog(repo)
    registry.refresh()
    for name, version, field in (("nope", 1, "model"), ("kt", 9, "version")):
        with pytest.raises(ServingError) as info:
            registry.get(name, version)
        assert info.value.code is grpc.StatusCode.NOT_FOUND and info.value.field == field


# -- service --------------------------------------------------------------------------------------
def test_predict_uses_the_latest_ready_version_and_reads_the_last_position(setup) -> None:
    service, backend, metrics = setup
    response = run(service.predict(predict_request(), Deadline.after(5)))
    assert response.model == "kt" and response.version == 2 and response.history_used == 1
    assert list(response.probabilities) == pytest.approx([0.02, 0.03])       # ids 2, 3 at the last slot
    (_, version, questions, timeout), = backend.calls
    assert version == 2 and questions.shape == (2, 5) and 0 < timeout <= 5
    backend.ready = {"kt": {1}}
    assert run(service.predict(predict_request(), Deadline.after(5))).version == 1
    assert metrics.registry.get_sample_value("routerkt_candidates_per_call_count") == 2


def test_explicit_version_and_not_found(setup) -> None:
    service, backend, _ = setup
    assert run(service.predict(predict_request(version=1), Deadline.after(5))).version == 1
    error = code_of(service.predict(predict_request(version=7), Deadline.after(5)))
    assert error.code is grpc.StatusCode.NOT_FOUND and error.field == "version"
    error = code_of(service.predict(predict_request(model="missing"), Deadline.after(5)))
    assert error.code is grpc.StatusCode.NOT_FOUND and error.field == "model"


@pytest.mark.parametrize("state", ["triton_down", "not_ready", "reloading", "version_not_ready"])
def test_unavailable_when_triton_or_the_model_is_not_ready(setup, state: str) -> None:
    service, backend, _ = setup
    version = 0
    if state == "triton_down":
        backend.triton_ready = False
    elif state == "not_ready":
        backend.ready = {}
    elif state == "reloading":
        backend.reloading.add("kt")
    else:
        backend.ready = {"kt": {2}}
        version = 1
    error = code_of(service.predict(predict_request(version=version), Deadline.after(5)))
    assert error.code is grpc.StatusCode.UNAVAILABLE
    assert backend.calls == []


@pytest.mark.parametrize("kind, code", [
    (FailureKind.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE),
    (FailureKind.STUB_CRASHED, grpc.StatusCode.UNAVAILABLE),
    (FailureKind.NOT_LOADED, grpc.StatusCode.UNAVAILABLE),
    (FailureKind.FAILED, grpc.StatusCode.UNAVAILABLE),
    (FailureKind.DEADLINE, grpc.StatusCode.DEADLINE_EXCEEDED),
    (FailureKind.REJECTED, grpc.StatusCode.INTERNAL),
])
def test_backend_failures_map_to_codes_without_triton_text(setup, kind: FailureKind, code) -> None:
    service, backend, metrics = setup
    backend.fail = BackendError(kind, "Traceback ... At: /secret/path/model.py(33): execute")
    error = code_of(service.predict(predict_request(), Deadline.after(5)))
    assert error.code is code
    assert "/secret/path" not in error.message and "Traceback" not in error.message
    assert metrics.registry.get_sample_value("routerkt_errors_total", {"code": code.name}) is None   # transports count


@pytest.mark.parametrize("kind, code", [(FailureKind.STUB_CRASHED, grpc.StatusCode.UNAVAILABLE),
                                        (FailureKind.DEADLINE, grpc.StatusCode.DEADLINE_EXCEEDED),
                                        (FailureKind.REJECTED, grpc.StatusCode.INTERNAL)])
def test_the_public_steps_compose_and_infer_outputs_maps_failures_as_infer_does(setup, kind, code) -> None:
    service, backend, metrics = setup
    core = service.service

    async def steps(deadline: Deadline) -> dict[str, np.ndarray]:
        async with core.call(deadline):
            learners = validate_query(predict_query(predict_request()), core.settings)
            [route] = await core.resolve("kt", 0, [""])
            [learner] = await core.complete_history(learners, route.primary, deadline)
            [encoded] = core.encode([learner], route.primary)
            return await core.infer_outputs(route.primary, encoded, ("a", "b"), deadline)

    out = run(steps(Deadline.after(5)))
    assert set(out) == {"a", "b"} and backend.calls[-1][:2] == ("kt", 2)
    assert list(out["a"][:, -1]) == pytest.approx([0.02, 0.03])       # as Predict: ids 2, 3 at the last slot
    backend.fail = BackendError(kind, "Traceback ... /secret/path")
    error = code_of(steps(Deadline.after(5)))
    assert error.code is code and "/secret/path" not in error.message
    calls = len(backend.calls)
    assert code_of(steps(Deadline.after(-0.1))).code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert len(backend.calls) == calls                               # an expired deadline never reaches it


def test_expired_deadline_never_reaches_the_backend(setup) -> None:
    service, backend, metrics = setup
    error = code_of(service.predict(predict_request(), Deadline.after(-0.1)))
    assert error.code is grpc.StatusCode.DEADLINE_EXCEEDED and backend.calls == []


def test_validation_errors_precede_model_lookup(setup) -> None:
    service, backend, metrics = setup
    bad = pb.PredictRequest(model="missing", candidates=[])
    error = code_of(service.predict(bad, Deadline.after(5)))
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT and error.field == "candidates"


def _burst(service, n: int, deadline_s: float = 5.0) -> list:
    async def burst():
        calls = [service.predict(predict_request(), Deadline.after(deadline_s)) for _ in range(n)]
        return await asyncio.gather(*calls, return_exceptions=True)
    return run(burst())


def _settings(service, **changes) -> None:
    core = service.service
    core.settings = dataclasses.replace(core.settings, **changes).validate()


def test_without_a_queue_the_inflight_limit_rejects_at_once(setup) -> None:
    service, backend, metrics = setup
    _settings(service, inflight_wait_s=0.0)
    backend.delay = 0.2
    results = _burst(service, 5)
    rejected = [r for r in results if isinstance(r, ServingError)]
    assert len(rejected) == 3 and all(r.code is grpc.StatusCode.RESOURCE_EXHAUSTED for r in rejected)
    assert sum(isinstance(r, pb.PredictResponse) for r in results) == 2
    assert metrics.registry.get_sample_value("routerkt_inflight_requests") == 0


def test_calls_beyond_the_inflight_limit_wait_for_a_slot(setup) -> None:
    service, backend, metrics = setup                      # max_inflight 2, default queue
    backend.delay = 0.1
    results = _burst(service, 5)
    assert all(isinstance(r, pb.PredictResponse) for r in results), results
    assert backend.max_concurrent <= 2
    assert metrics.registry.get_sample_value("routerkt_queued_requests") == 0


def test_the_queue_is_bounded(setup) -> None:
    service, backend, _ = setup
    _settings(service, max_queued=1)
    backend.delay = 0.1
    results = _burst(service, 5)                            # 2 served, 1 queued, 2 refused at once
    assert sum(isinstance(r, pb.PredictResponse) for r in results) == 3
    refused = [r for r in results if isinstance(r, ServingError)]
    assert [r.code for r in refused] == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2
    assert all("queue is full" in r.message for r in refused)


def test_a_call_waits_only_while_its_deadline_covers_a_typical_call(setup) -> None:
    service, backend, _ = setup
    backend.delay = 0.3
    service.service.service_time.per_call = 0.3             # calls have been taking 0.3 s
    started = time.monotonic()
    results = _burst(service, 4, deadline_s=0.5)            # the 2 queued ones could wait only 0.2 s
    assert sum(isinstance(r, pb.PredictResponse) for r in results) == 2
    assert [r.code for r in results if isinstance(r, ServingError)] == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2
    assert time.monotonic() - started < 0.45                # refused after their 0.2 s, not at the deadline


def test_unexpected_exceptions_become_internal_with_a_safe_message(setup) -> None:
    service, backend, _ = setup

    async def boom(*args, **kwargs):
        raise ValueError("secret detail /etc/passwd")
    backend.infer = boom
    error = code_of(service.predict(predict_request(), Deadline.after(5)))
    assert error.code is grpc.StatusCode.INTERNAL and "secret" not in error.message


def test_batch_packs_whole_learners_and_keeps_order(setup) -> None:
    service, backend, _ = setup
    learners = [pb.LearnerRequest(history=[pb.Interaction(question_id=100, skill_id=7, correct=1)] * i,
                                  candidates=[pb.Candidate(question_id=q) for q in cands])
                for i, cands in enumerate([(100, 101), (102,), (101, 100, 102), (100,)])]
    response = run(service.predict_batch(pb.PredictBatchRequest(model="kt", version=1, learners=learners),
                                         Deadline.after(5)))
    assert [list(r.probabilities) for r in response.results] == [
        pytest.approx(p) for p in ([0.02, 0.03], [0.04], [0.03, 0.02, 0.04], [0.02])]
    assert [r.history_used for r in response.results] == [0, 1, 2, 3]
    rows = [call[2].shape[0] for call in backend.calls]
    assert rows == [3, 4]                                   # 2+1 | 3+1 with max_rows_per_infer 4
    backend.ready["small"] = {1}
    response = run(service.predict_batch(pb.PredictBatchRequest(model="small", learners=learners), Deadline.after(5)))
    assert [call[2].shape[0] for call in backend.calls[2:]] == [3, 3, 1]   # capped by max_batch_size 3
    assert [len(r.probabilities) for r in response.results] == [2, 1, 3, 1]


def test_candidates_beyond_the_models_max_batch_size_are_invalid(setup) -> None:
    service, backend, _ = setup
    backend.ready["small"] = {1}
    request = predict_request(candidates=(100, 101, 102))
    request.model = "small"
    run(service.predict(request, Deadline.after(5)))                         # 3 rows fit max_batch_size 3
    request.candidates.append(pb.Candidate(question_id=100))
    _settings(service, max_candidates=4)                                    # Settings are frozen: a replaced copy
    error = code_of(service.predict(request, Deadline.after(5)))
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT and error.field == "candidates"


def test_batch_equals_individual_predicts(setup) -> None:
    service, _, _ = setup
    singles = [predict_request(candidates=(100, 102), history=((101, 8, 0), (100, 7, 1))),
               predict_request(candidates=(101,), history=())]
    batch = pb.PredictBatchRequest(model="kt", learners=[pb.LearnerRequest(history=r.history, candidates=r.candidates)
                                                         for r in singles])
    together = run(service.predict_batch(batch, Deadline.after(5)))
    for single, result in zip(singles, together.results):
        alone = run(service.predict(single, Deadline.after(5)))
        assert list(alone.probabilities) == list(result.probabilities)
        assert alone.history_used == result.history_used


def test_a_call_of_several_rank_inferences_yields_a_fair_share_to_the_calls_in_flight(setup) -> None:
    facade, _, _ = setup
    service = facade.service
    service.settings = dataclasses.replace(service.settings, bulk_pause_ratio=1.0).validate()
    starts: list[float] = []

    async def infer_one(model, feeds, deadline, bulk=False):
        starts.append(time.monotonic())
        await asyncio.sleep(0.05)
        return feeds
    service._infer_one = infer_one
    calls = [type("Call", (), {"feeds": i})() for i in range(3)]

    def gaps(inflight: int, deadline_s: float) -> tuple[list[float], float]:
        starts.clear()
        service._inflight = inflight
        began = time.monotonic()
        assert run(service._infer_in_turn(None, calls, Deadline.after(deadline_s))) == [0, 1, 2]
        return [b - a for a, b in zip(starts, starts[1:])], time.monotonic() - began
    one_other, _ = gaps(inflight=2, deadline_s=5.0)
    assert all(0.09 < g < 0.2 for g in one_other)                    # round trip 0.05 + one turn of 0.05
    three_others, _ = gaps(inflight=4, deadline_s=5.0)
    assert all(0.19 < g < 0.4 for g in three_others)                 # ... + three turns: one for each other call
    alone, _ = gaps(inflight=1, deadline_s=5.0)
    assert all(g < 0.08 for g in alone)                              # alone: no pause
    tight, took = gaps(inflight=4, deadline_s=0.3)                   # the pauses shrink to fit the deadline
    assert took < 0.34 and all(0.06 < g < 0.17 for g in tight)        # (three turns would be 0.2 each)
