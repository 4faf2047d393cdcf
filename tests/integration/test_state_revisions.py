"""A cached learner state is checked against the store's log revision with one small read (serving/sessions/
history.py): a Predict by learner_id whose state the log still continues reads only the events stored after it,
never the whole history, and answers as the same history sent explicitly (<= 1e-5). Two gateways on one real
Redis store stay exact: answers Observed on one are seen by the other's next Predict, a learner forgotten and
observed again on one is rebuilt on the other, a slid window is rebuilt."""
from __future__ import annotations

import pytest

from serving.api import knowledge_tracing_pb2 as pb
from serving.sessions.redis_server import RedisServer
from serving.sessions.redis_store import RedisStore
from tests.integration.test_learner_states import Learner, Served, setup  # noqa: F401  (the module's fixture)

pytestmark = pytest.mark.integration
pytest.importorskip("torch")


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    with RedisServer(tmp_path_factory.mktemp("redis-revisions")) as server:
        yield server


def test_a_cached_learner_reads_only_what_was_stored_after_its_state(setup) -> None:
    repository, store_path, questions, skills = setup
    served = Served(repository, store_path.with_name("since.sqlite3"), fill=False)
    try:
        learner = Learner(served, "since-learner", questions, skills, seed=11)
        learner.observe(6)
        gaps = [learner.gap()]                                  # a miss: the whole history read
        assert served.reads() == {"history": 1, "history_since": 0}    # the explicit Predict reads nothing
        gaps.append(learner.gap())                              # a hit: one small read, no history
        assert served.reads() == {"history": 1, "history_since": 1}
        learner.observe(3)
        gaps.append(learner.gap())                              # 3 appended: read after the state, appended
        assert served.reads() == {"history": 1, "history_since": 2}
        assert served.lookups() == {"miss": 1, "hit": 1, "appended": 1, "stale": 0}
        learner.observe(5)                                      # more than max_appends: the whole history
        gaps.append(learner.gap())
        assert served.reads() == {"history": 2, "history_since": 3}
        assert served.lookups()["stale"] == 1
        assert max(gaps) <= 1e-5, gaps
    finally:
        served.close()


def test_two_gateways_on_one_redis_store_answer_exactly_after_each_others_observes(setup, redis_server) -> None:
    repository, _, questions, skills = setup
    url = redis_server.url
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    a, b = (Served(repository, None, store=RedisStore(host, int(port), db=5)) for _ in range(2))
    try:
        learner = Learner(a, "shared-learner", questions, skills, seed=12)
        learner.observe(5)
        gaps = [learner.gap(served=a), learner.gap(served=b)]   # both gateways hold the learner's state
        learner.observe(2)                                      # stored through A (A's fill follows)
        gaps.append(learner.gap(served=b))                      # B: its state, then the 2 answers A stored
        assert b.lookups() == {"miss": 1, "hit": 0, "appended": 1, "stale": 0}
        learner.served = b
        learner.observe(3)                                      # stored through B
        gaps.append(learner.gap(served=a))
        assert a.lookups()["appended"] == 1 and a.lookups()["stale"] == 0
        b.stub.ForgetLearner(pb.ForgetLearnerRequest(learner_id=learner.name), timeout=10.0)
        learner.history = []
        learner.observe(4)                                      # a new log on B: A's state is not continued
        gaps.append(learner.gap(served=a))
        assert a.lookups()["stale"] == 1
        learner.observe(16)                                     # past the window (20): slid, rebuilt
        gaps.append(learner.gap(served=a))
        gaps.append(learner.gap(served=b))
        assert max(gaps) <= 1e-5, gaps
        assert a.reads()["history_since"] == 3 and b.reads()["history_since"] == 1
    finally:
        a.close()
        b.close()
