"""serving/outcomes/tracker.py over a real SQLite store: served predictions are joined with the
answers of newly stored events once, by learner key or prediction id, and never after they expire."""
from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from serving.status_errors import ServingError
from serving.metrics import Metrics
from serving.outcomes.tracker import OutcomeTracker
from serving.pipeline.parts import PredictionRecord
from serving.core.calls import LearnerPrediction, LearnerQuery, PredictQuery, PredictResult
from serving.sessions.keys import LearnerKeys
from serving.sessions.sqlite_store import SqliteStore
from serving.settings import Settings

pytestmark = pytest.mark.unit

KEYS = LearnerKeys(b"tracker-test-secret-32-bytes-ok!")


def record(tracker: OutcomeTracker, learner_id: str, questions: list[int], probs: list[float], version: int = 1,
           prediction_id: str = "") -> None:
    query = LearnerQuery.from_values([], [(q, None) for q in questions], learner_id)
    result = PredictResult("kt", version, [LearnerPrediction(np.array(probs, dtype=np.float32), 0, version,
                                                             prediction_id)])
    tracker.on_prediction(PredictionRecord(PredictQuery("kt", 0, [query]), result))


async def scenario(tmp_path, body, ttl_s: float = 3600.0):
    store = SqliteStore(tmp_path / "s.sqlite3")
    await store.open()
    metrics = Metrics()
    tracker = OutcomeTracker(Settings(outcome_ttl_s=ttl_s), store, KEYS, metrics)
    worker = asyncio.create_task(tracker.maintain())
    try:
        return await body(tracker, metrics)
    finally:
        worker.cancel()
        await store.close()


async def joined(tracker: OutcomeTracker, metrics: Metrics, learner: str, questions, correct, new) -> float:
    """Observe's join, run to its end; returns the pairs it recorded."""
    before = outcomes(metrics, 1) + outcomes(metrics, 2)
    tracker.observed(KEYS.learner(learner), np.array(questions), np.array(correct), tuple(new))
    await tracker.drain()
    return outcomes(metrics, 1) + outcomes(metrics, 2) - before


def outcomes(metrics: Metrics, version: int = 1) -> float:
    return metrics.registry.get_sample_value("routerkt_outcomes_total", {"model": "kt", "version": str(version)}) or 0


def test_observed_answers_join_once_and_only_for_new_events(tmp_path) -> None:
    async def body(tracker, metrics):
        record(tracker, "ann", [10, 11, 12], [0.25, 0.5, 0.75])
        record(tracker, "ann", [10], [0.125], version=2)          # a shadow version's entry for question 10
        q, c = [10, 11, 10, 12], [1, 0, 0, 1]
        n = await joined(tracker, metrics, "ann", q, c, (True, True, True, False))   # event 4 was a duplicate
        assert n == 3                                               # q10 by v1 and v2, q11 by v1
        assert outcomes(metrics, 1) == 2 and outcomes(metrics, 2) == 1
        ll = metrics.registry.get_sample_value("routerkt_outcome_log_loss_sum", {"model": "kt", "version": "1"})
        assert ll == pytest.approx(-np.log(0.25) - np.log(0.5))   # q10 answered 1 (first event), q11 answered 0
        assert await joined(tracker, metrics, "ann", q, c, (True, True, True, True)) == 1   # only q12 is left
    asyncio.run(scenario(tmp_path, body))


def test_a_stateless_prediction_is_reported_by_its_id(tmp_path) -> None:
    pid = "0123456789abcdef0123456789abcdef"

    async def body(tracker, metrics):
        record(tracker, "", [5, 6], [0.9, 0.1], prediction_id=pid)
        assert await tracker.report(pid, 6, 0) == 1
        assert await tracker.report(pid, 6, 0) == 0                # once
        assert await tracker.report("f" * 32, 5, 1) == 0           # unknown id
        for bad, field in ((("xyz", 5, 1)), "prediction_id"), (((pid, 5, 2)), "correct"), (((pid, -1, 1)), "question_id"):
            with pytest.raises(ServingError) as info:
                await tracker.report(*bad)
            assert info.value.field == field
        assert outcomes(metrics) == 1
    asyncio.run(scenario(tmp_path, body))


def test_expired_predictions_are_not_joined(tmp_path) -> None:
    async def body(tracker, metrics):
        record(tracker, "bob", [7], [0.5])
        await tracker.drain()
        await asyncio.sleep(0.3)
        return await joined(tracker, metrics, "bob", [7], [1], (True,))
    assert asyncio.run(scenario(tmp_path, body, ttl_s=0.2)) == 0


def test_joins_run_in_call_order(tmp_path) -> None:
    async def body(tracker, metrics):
        record(tracker, "fay", [4], [0.25])
        tracker.observed(KEYS.learner("fay"), np.array([4]), np.array([1]), (True,))
        record(tracker, "fay", [4], [0.75])        # a later prediction: not the one the answer followed
        await tracker.drain()
        assert metrics.registry.get_sample_value("routerkt_outcome_log_loss_sum",
                                                 {"model": "kt", "version": "1"}) == pytest.approx(-np.log(0.25))
        return await joined(tracker, metrics, "fay", [4], [0], (True,))
    assert asyncio.run(scenario(tmp_path, body)) == 1       # the later one waits for the next answer


def test_a_full_queue_drops_and_counts(tmp_path) -> None:
    async def body(tracker, metrics):
        tracker.settings = dataclasses.replace(tracker.settings, max_pending_served=3).validate()
        record(tracker, "cy", [1, 2], [0.5, 0.5])
        record(tracker, "cy", [3, 4], [0.5, 0.5])                  # would make 4 > 3
        assert metrics.registry.get_sample_value("routerkt_served_dropped_total") == 2
    asyncio.run(scenario(tmp_path, body))


def test_discard_drops_what_is_queued_for_a_forgotten_learner(tmp_path) -> None:
    async def body(tracker, metrics):
        record(tracker, "dee", [1], [0.5])
        record(tracker, "eve", [1], [0.5])
        await tracker.discard(KEYS.learner("dee"))
        dee = await joined(tracker, metrics, "dee", [1], [1], (True,))
        eve = await joined(tracker, metrics, "eve", [1], [1], (True,))
        return dee, eve
    assert asyncio.run(scenario(tmp_path, body)) == (0, 1)


def test_the_learner_key_made_by_the_call_is_used_not_made_again(tmp_path) -> None:
    """A prediction carrying its learner's key (the history source's, once per call) is remembered under it; the
    tracker's own keys are not asked, and the join by that key finds it."""
    class NoKeys:
        def learner(self, learner_id: str) -> str:
            raise AssertionError("the learner id was keyed a second time")

    async def body(tracker, metrics):
        tracker.keys = NoKeys()
        query = LearnerQuery.from_values([], [(10, None)], "ann")
        probs = np.array([0.4], dtype=np.float32)
        result = PredictResult("kt", 1, [LearnerPrediction(probs, 0, 1, "", KEYS.learner("ann"))])
        tracker.on_prediction(PredictionRecord(PredictQuery("kt", 0, [query]), result))
        return await joined(tracker, metrics, "ann", [10], [1], [True])
    assert asyncio.run(scenario(tmp_path, body)) == 1
