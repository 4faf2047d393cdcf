"""Skills no served version knows, through the real gateway in-process (onnxruntime backend over the
tiny exported model, a real SQLite session store): Observe stores them, Predict by learner_id answers
exactly as the same explicit history (both map them to the unknown id, counted), Mastery still refuses
to report one, and `routerkt sessions export` writes them, so the retrain's grown vocabulary adds them."""
from __future__ import annotations

import csv

import grpc
import numpy as np
import pytest

from routerkt.cli import main as routerkt_main
from routerkt.contract.repository_reader import latest_version, read_vocab
from routerkt.contract.vocab import Vocab
from serving.api import knowledge_tracing_pb2 as pb
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
from serving.backends.onnxruntime import OnnxRuntimeBackend
from serving.metrics import Metrics
from serving.server import ThreadedGateway
from serving.sessions.keys import LearnerKeys
from serving.sessions.sqlite_store import SqliteStore
from serving.settings import Settings

pytestmark = pytest.mark.integration

pytest.importorskip("torch")
LEARNER = "learner-with-new-skills"


@pytest.fixture(scope="module")
def served(kt_repository, tmp_path_factory):
    folder = tmp_path_factory.mktemp("unknown-skills")
    store_path = folder / "sessions.sqlite3"
    settings = Settings(repository=kt_repository.path, grpc_port=0, http_port=None, grace_period_s=0.5)
    metrics = Metrics()
    gw = ThreadedGateway(settings, metrics, backend=OnnxRuntimeBackend(settings), store=SqliteStore(store_path),
                         keys=LearnerKeys(b"unknown-skills-test-secret-32b!!")).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}")
    vocab = read_vocab(kt_repository.path, kt_repository.name, latest_version(kt_repository.path, kt_repository.name))
    try:
        yield pb_grpc.KnowledgeTracingServiceStub(channel), metrics, vocab, f"sqlite:///{store_path}"
    finally:
        channel.close()
        gw.stop(0.5)


def skill_fields(skills) -> dict:
    """Interaction / Event / Candidate keyword arguments: None (looked up), one id, or a set."""
    if skills is None:
        return {}
    return {"skill_ids": list(skills)} if isinstance(skills, list) else {"skill_id": skills}


def minus_one_for(unknown: set[int], skills):
    """`skills` (None, one id or a list) with every id of `unknown` written as -1."""
    if isinstance(skills, list):
        return [-1 if s in unknown else s for s in skills]
    return -1 if skills in unknown else skills


def test_unknown_skills_are_stored_predicted_as_the_unknown_id_and_exported(served, tmp_path) -> None:
    stub, metrics, vocab, store_url = served
    questions = [q for q, skills in sorted(vocab.question_skills.items()) if all(s in vocab.skills for s in skills)]
    skills = sorted(vocab.skills)
    new, newer = max(skills) + 1000, max(skills) + 2000               # skills no served version knows
    q = questions
    # (question, skills, correct): a known skill, a set with a new one, a new one alone, a new question
    # with a new skill, a looked-up set, an explicit -1
    history = [(q[0], skills[0], 1), (q[1], [skills[1], new], 0), (q[2], new, 1), (10**9, newer, 0),
               (q[3], None, 1), (q[4], -1, 0)]
    events = [pb.Event(event_id=f"e{i}", question_id=question, correct=c, timestamp_ms=1_000 + i,
                       **skill_fields(s)) for i, (question, s, c) in enumerate(history)]
    stored = stub.Observe(pb.ObserveRequest(learner_id=LEARNER, events=events), timeout=10.0)
    assert (stored.stored, stored.duplicates, stored.history_length) == (len(history), 0, len(history))

    candidates = [pb.Candidate(question_id=q[5]), pb.Candidate(question_id=q[6], skill_id=new),
                  pb.Candidate(question_id=q[7], skill_ids=[skills[0], new])]

    def explicit(items) -> pb.PredictRequest:
        return pb.PredictRequest(model="kt", candidates=candidates, history=[
            pb.Interaction(question_id=question, correct=c, **skill_fields(s)) for question, s, c in items])

    unknown_skills = metrics.unknown_ids.labels(kind="skill")
    before = unknown_skills._value.get()
    by_id = stub.Predict(pb.PredictRequest(model="kt", learner_id=LEARNER, candidates=candidates), timeout=10.0)
    # history: new in e1, e2, e3 and the -1 of e5; candidates: new in the second and third
    assert unknown_skills._value.get() - before == 6
    as_sent = stub.Predict(explicit(history), timeout=10.0)
    assert unknown_skills._value.get() - before == 12
    as_minus_one = stub.Predict(explicit([(question, minus_one_for({new, newer}, s), c) for question, s, c in history]),
                                timeout=10.0)
    assert by_id.history_used == as_sent.history_used == len(history)
    np.testing.assert_allclose(by_id.probabilities, as_sent.probabilities, atol=1e-6, rtol=0)
    np.testing.assert_allclose(as_minus_one.probabilities, as_sent.probabilities, atol=1e-6, rtol=0)

    # Mastery answers over that history, but a knowledge state of an unknown skill stays undefined
    mastery = stub.Mastery(pb.MasteryRequest(model="kt", learner_id=LEARNER, skill_ids=[skills[0]]), timeout=10.0)
    assert [s.skill_id for s in mastery.skills] == [skills[0]] and mastery.history_used == len(history)
    with pytest.raises(grpc.RpcError) as caught:
        stub.Mastery(pb.MasteryRequest(model="kt", learner_id=LEARNER, skill_ids=[skills[0], new]), timeout=10.0)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert dict(caught.value.trailing_metadata() or ()).get("routerkt-field") == "skill_ids[1]"

    out = tmp_path / "events.csv"
    assert routerkt_main(["sessions", "export", "--store", store_url, "--out", str(out)]) == 0
    with open(out, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(int(r["question_id"]), r["skill_id"], int(r["correct"])) for r in rows] == [
        (q[0], str(skills[0]), 1), (q[1], f"{skills[1]};{new}", 0), (q[2], str(new), 1), (10**9, str(newer), 0),
        (q[3], "-1", 1), (q[4], "-1", 0)]

    from loop.retrain.data import grown_vocab                      # the retrain's vocabulary growth
    from training.data.csv_reader import read_interactions
    grown, counts = grown_vocab(vocab, Vocab.build(read_interactions(out)))
    assert counts["new_skills"] == 2 and {new, newer} <= set(grown.skills)
    assert grown.question_skills[10**9] == (newer,)
