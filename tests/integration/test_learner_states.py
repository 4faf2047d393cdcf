"""The learner-state path through the real gateway in-process (onnxruntime backend over the tiny model exported
with --step-graphs, window 20; a real SQLite store): Predict by learner_id answers exactly as the same history
sent explicitly (<= 1e-5) on a miss, a hit, appended answers, a rebuild (too many new answers, the window
sliding past W - 1), with skill sets and 20 candidates; the routerkt_state_* metrics say which path ran;
ForgetLearner drops the learner's states; a second gateway on the same store that rewrites the learner's
history makes the first one rebuild, never answer from a stale state; with --state-cache-mb 0 nothing is cached."""
from __future__ import annotations

import time

import grpc
import numpy as np
import pytest

from routerkt.contract.repository_reader import latest_version, read_vocab
from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.backends.onnxruntime import OnnxRuntimeBackend
from serving.encoder.window import WindowEncoder
from serving.metrics import Metrics
from serving.server import ThreadedGateway
from serving.sessions.keys import LearnerKeys
from serving.sessions.sqlite_store import SqliteStore
from serving.settings import Settings

pytestmark = pytest.mark.integration

pytest.importorskip("torch")
WINDOW = 20
SECRET = b"learner-states-test-secret-32b!!"
RESULTS = ("miss", "hit", "appended", "stale")
FILLS = ("filled", "dropped", "superseded", "skipped", "failed")


class Served:
    """One gateway over the store at `store_path`, its stub and metrics."""

    def __init__(self, repository, store_path, state_cache_mb: float = 64.0, triton_url: str | None = None,
                 prefix_cache: bool = False, fill: bool = True, encoder=None, store=None, **more) -> None:
        """In-process onnxruntime, or (`triton_url`) the Triton backend over a running tritonserver; the SQLite
        store at `store_path`, or `store` (another SessionStore, e.g. a RedisStore)."""
        self.fill = fill
        settings = Settings(repository=repository, grpc_port=0, http_port=None, grace_period_s=0.5,
                            state_cache_mb=state_cache_mb, prefix_cache=prefix_cache, fill_on_observe=fill, **more,
                            **({"triton_url": triton_url} if triton_url else {}))
        self.metrics = Metrics()
        backend = {} if triton_url else {"backend": OnnxRuntimeBackend(settings)}
        if encoder is not None:
            backend["encoder"] = encoder
        self.gateway = ThreadedGateway(settings, self.metrics, store=store or SqliteStore(store_path),
                                       keys=LearnerKeys(SECRET), **backend).start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.gateway.grpc_port}")
        self.stub = pb_grpc.KnowledgeTracingServiceStub(self.channel)

    def lookups(self, key: str = "learner") -> dict[str, int]:
        return {r: int(self.metrics.registry.get_sample_value(
            "routerkt_state_lookups_total", {"model": "kt", "key": key, "result": r}) or 0) for r in RESULTS}

    def fills(self) -> dict[str, int]:
        return {r: int(self.metrics.registry.get_sample_value(
            "routerkt_state_fills_total", {"model": "kt", "result": r}) or 0) for r in FILLS}

    def await_fills(self, expected: dict[str, int]) -> None:
        """Until Observe's background fills reach `expected` (10 s at most)."""
        deadline = time.monotonic() + 10.0
        while self.fills() != expected and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.fills() == expected

    def reads(self) -> dict[str, int]:
        """Store reads so far: whole histories, and the small reads that continue a cached state."""
        return {op: int(self.metrics.registry.get_sample_value(
            "routerkt_store_seconds_count", {"operation": op}) or 0) for op in ("history", "history_since")}

    def cached(self) -> tuple[int, int]:
        return (int(self.metrics.registry.get_sample_value("routerkt_state_cache_learners") or 0),
                int(self.metrics.registry.get_sample_value("routerkt_state_cache_bytes") or 0))

    def close(self) -> None:
        self.channel.close()
        self.gateway.stop(0.5)


@pytest.fixture(scope="module")
def setup(kt_step_repository, tmp_path_factory):
    folder = tmp_path_factory.mktemp("learner-states")
    repository = kt_step_repository.path
    vocab = read_vocab(repository, "kt", latest_version(repository, "kt"))
    questions = [q for q, skills in sorted(vocab.question_skills.items()) if all(s in vocab.skills for s in skills)]
    yield repository, folder / "sessions.sqlite3", questions, sorted(vocab.skills)


class Learner:
    """A learner observed through `served`, and the explicit-history Predict it is compared with."""

    def __init__(self, served: Served, name: str, questions: list[int], skills: list[int], seed: int) -> None:
        self.served, self.name, self.questions, self.skills = served, name, questions, skills
        self.rng = np.random.default_rng(seed)
        self.history: list[tuple[int, list[int], int]] = []
        self.sent = 0

    def observe(self, n: int) -> None:
        events = []
        for _ in range(n):
            item = (int(self.rng.choice(self.questions)), [int(s) for s in self.rng.choice(
                self.skills, int(self.rng.integers(1, 3)), replace=False)], int(self.rng.integers(0, 2)))
            self.history.append(item)
            events.append(pb.Event(event_id=f"{self.name}-{self.sent}", question_id=item[0], skill_ids=item[1],
                                   correct=item[2], timestamp_ms=1_000 + self.sent))
            self.sent += 1
        stored = self.served.stub.Observe(pb.ObserveRequest(learner_id=self.name, events=events), timeout=10.0)
        assert stored.stored == n

    def gap(self, n_candidates: int = 3, served: Served | None = None) -> float:
        """max |Predict by learner_id - the same history sent explicitly|."""
        stub = (served or self.served).stub
        candidates = [pb.Candidate(question_id=int(q), skill_ids=[int(s)])
                      for q, s in zip(self.rng.choice(self.questions, n_candidates),
                                      self.rng.choice(self.skills, n_candidates))]
        by_id = stub.Predict(pb.PredictRequest(model="kt", learner_id=self.name, candidates=candidates), timeout=10.0)
        explicit = stub.Predict(pb.PredictRequest(model="kt", candidates=candidates, history=[
            pb.Interaction(question_id=q, skill_ids=s, correct=c) for q, s, c in self.history]), timeout=10.0)
        assert by_id.history_used == explicit.history_used == min(len(self.history), WINDOW - 1)
        return float(np.abs(np.asarray(by_id.probabilities) - np.asarray(explicit.probabilities)).max())


class CountingEncoder(WindowEncoder):
    """The window encoder, counting the calls the learner-state path makes of it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def __getattribute__(self, name: str):
        if name in ("encode_new", "history_row", "split_candidates", "candidate_width", "widen"):
            calls = object.__getattribute__(self, "calls")
            calls[name] = calls.get(name, 0) + 1
        return object.__getattribute__(self, name)


def test_a_custom_encoder_builds_the_learner_state_paths_feeds(setup, tmp_path) -> None:
    """The Encoder given to create_server encodes Observe's answers and builds the step feeds (no path
    around it), and the answers stay those of the explicit history."""
    repository, _, questions, skills = setup
    encoder = CountingEncoder()
    served = Served(repository, tmp_path / "s.sqlite3", encoder=encoder)
    try:
        learner = Learner(served, "custom-encoder", questions, skills, seed=5)
        learner.observe(4)
        assert learner.gap() < 1e-5                      # a miss: step_start from the encoder's history row
        learner.observe(2)
        served.await_fills({**dict.fromkeys(FILLS, 0), "filled": 1})
        assert learner.gap() < 1e-5                      # a hit on the state Observe's fill advanced
    finally:
        served.close()
    for name in ("encode_new", "history_row", "split_candidates", "candidate_width", "widen"):
        assert encoder.calls.get(name, 0) > 0, (name, encoder.calls)


@pytest.mark.parametrize("fill", [True, False], ids=["fill-on-observe", "no-fill"])
def test_predict_by_learner_id_answers_as_the_explicit_history_on_every_path(setup, fill: bool) -> None:
    repository, store_path, questions, skills = setup
    served = Served(repository, store_path, fill=fill)
    try:
        walk_every_path(served, questions, skills)
    finally:
        served.close()


# Each step of the walk: answers observed (0: none), then the lookup of the next Predict by learner_id
# (without fills, with Observe's fills) and the fill the Observe made (None: none).
WALK = (
    (5, "miss", "miss", None),                 # nothing cached: step_start, then step_next
    (0, "hit", "hit", None),                   # the same history: step_next only (20 candidates)
    (1, "appended", "hit", "filled"),          # one step_append (by the Predict, or by the Observe)
    (4, "appended", "hit", "filled"),          # four, the most appended (MAX_APPENDS)
    (5, "stale", "miss", "dropped"),           # five: rebuilt (15 kept)
    (4, "appended", "hit", "filled"),          # 19 kept: the window is full
    (0, "hit", "hit", None),
    (1, "stale", "miss", "dropped"),           # the window slid: every cached value changed, rebuilt
    (2, "stale", "miss", "dropped"),
)


def walk_every_path(served: Served, questions: list[int], skills: list[int]) -> None:
    """One learner through miss, hit, appended (or filled by Observe), rebuilt at and past the window edge,
    forgotten: every Predict by learner_id within 1e-5 of the explicit history, and the lookups and fills
    metrics naming each path."""
    learner = Learner(served, f"stepping-learner-{served.fill}", questions, skills, seed=0)
    expected, fills = dict.fromkeys(RESULTS, 0), dict.fromkeys(FILLS, 0)
    gaps = []

    def check(result: str, n_candidates: int = 3) -> None:
        gaps.append(learner.gap(n_candidates))
        expected[result] += 1
        assert served.lookups() == expected, result

    for step, (observed, plain, filled, fill) in enumerate(WALK):
        if observed:
            learner.observe(observed)
        if served.fill and fill is not None:
            fills[fill] += 1
        served.await_fills(fills)
        check(filled if served.fill else plain, 20 if step in (1, 8) else 3)
    assert max(gaps) <= 1e-5, gaps
    learners, nbytes = served.cached()
    assert learners == 1 and nbytes > 0

    served.stub.ForgetLearner(pb.ForgetLearnerRequest(learner_id=learner.name), timeout=10.0)
    assert served.cached() == (0, 0)
    learner.history = []
    learner.observe(3)
    check("miss")
    assert max(gaps) <= 1e-5, gaps


def test_a_history_rewritten_by_another_gateway_is_rebuilt_not_answered_from_the_stale_state(setup) -> None:
    repository, store_path, questions, skills = setup
    first, second = Served(repository, store_path), Served(repository, store_path)
    try:
        learner = Learner(first, "rewritten-learner", questions, skills, seed=1)
        learner.observe(8)
        assert learner.gap() <= 1e-5 and first.lookups()["miss"] == 1
        second.stub.ForgetLearner(pb.ForgetLearnerRequest(learner_id=learner.name), timeout=10.0)
        learner.served, learner.history = second, []
        learner.observe(8)                        # another 8 answers: the first gateway was not told
        assert learner.gap(served=first) <= 1e-5
        assert first.lookups() == {"miss": 1, "hit": 0, "appended": 0, "stale": 1}
    finally:
        first.close()
        second.close()


def test_a_budget_of_zero_caches_nothing_and_answers_the_same(setup) -> None:
    repository, store_path, questions, skills = setup
    served = Served(repository, store_path, state_cache_mb=0)
    try:
        learner = Learner(served, "uncached-learner", questions, skills, seed=2)
        learner.observe(6)
        assert learner.gap() <= 1e-5 and learner.gap() <= 1e-5
        assert served.lookups() == dict.fromkeys(RESULTS, 0) and served.cached() == (0, 0)
    finally:
        served.close()


def test_the_prefix_cache_answers_stateless_predicts_as_the_full_forward(setup) -> None:
    """--prefix-cache: a history sent again (hit), with new answers (appended) or changed (miss: another
    hash) answers as a gateway without any cache; Predict by learner_id keeps its own keys."""
    repository, store_path, questions, skills = setup
    cached, plain = Served(repository, store_path, prefix_cache=True), Served(repository, store_path, state_cache_mb=0)
    try:
        learner = Learner(cached, "prefix-learner", questions, skills, seed=3)
        rng = np.random.default_rng(5)
        candidates = [pb.Candidate(question_id=int(q)) for q in rng.choice(questions, 4)]

        def gap(history) -> float:
            request = pb.PredictRequest(model="kt", candidates=candidates, history=[
                pb.Interaction(question_id=q, skill_ids=s, correct=c) for q, s, c in history])
            got = [np.asarray(served.stub.Predict(request, timeout=10.0).probabilities) for served in (cached, plain)]
            return float(np.abs(got[0] - got[1]).max())

        learner.observe(6)
        gaps, expected = [gap(learner.history)], dict.fromkeys(RESULTS, 0)
        expected["miss"] += 1
        gaps.append(gap(learner.history))
        expected["hit"] += 1
        for n in (1, 3, 5):                       # 5 new answers: past max_appends, a new entry
            learner.observe(n)
            gaps.append(gap(learner.history))
            expected["appended" if n <= 4 else "miss"] += 1
        changed = list(learner.history)
        changed[2] = (changed[2][0], changed[2][1], 1 - changed[2][2])
        gaps.append(gap(changed))
        expected["miss"] += 1
        assert max(gaps) <= 1e-5, gaps
        assert cached.lookups("history") == expected
        assert cached.lookups("learner") == dict.fromkeys(RESULTS, 0)
        assert learner.gap() <= 1e-5 and cached.lookups("learner")["miss"] == 1
    finally:
        cached.close()
        plain.close()
