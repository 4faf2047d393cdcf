"""Step batching on (step_batch_rows > 1) through the real gateway in-process: concurrent Predicts by learner_id
of different learners share step calls and each answers as its history sent explicitly (<= 1e-5)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integration.test_learner_states import Learner, Served, setup  # noqa: F401  (the module's fixture)

pytestmark = pytest.mark.integration
pytest.importorskip("torch")


def test_concurrent_predicts_share_step_calls_and_answer_exactly(setup) -> None:
    repository, store_path, questions, skills = setup
    served = Served(repository, store_path.with_name("batching.sqlite3"), fill=False, step_batch_rows=64)
    try:
        learners = [Learner(served, f"batched-{k}", questions, skills, seed=20 + k) for k in range(8)]
        for learner in learners:
            learner.observe(6)
        with ThreadPoolExecutor(8) as pool:
            for _ in range(3):
                gaps = list(pool.map(lambda learner: learner.gap(), learners))
                assert max(gaps) <= 1e-5, gaps
                for learner in learners:
                    learner.observe(1)
        # every step call went through the batcher: routerkt_step_batch_calls counts them all
        sample = served.metrics.registry.get_sample_value
        joined = sample("routerkt_step_batch_calls_sum", {"model": "kt"})
        calls = sample("routerkt_step_batch_calls_count", {"model": "kt"})
        assert calls and joined >= calls
    finally:
        served.close()
