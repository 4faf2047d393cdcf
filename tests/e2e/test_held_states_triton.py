"""Held states through real tritonservers (routerkt/contract/step_signature.py, serving/state/placement.py):
two Triton replicas over the tiny step model, one gateway over both that lets Triton keep the learner states
(the default where config.pbtxt declares them) and one over the first alone that sends them. Every Predict by
learner_id answers as the same history sent (<= 1e-5); the learners' states spread over both replicas; the
held gateway's cache keeps histories and keys, not states. A replica killed, then restarted empty, costs
rebuilds (`lost` lookups), never a failed call or another answer. ForgetLearner deletes the learner's state
in Triton too."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from routerkt.contract.repository_reader import latest_version, read_vocab
from serving.api import knowledge_tracing_pb2 as pb
from serving.sessions.keys import LearnerKeys
from serving.state.placement import SLOT_MASK
from serving.tritonserver.launcher import TritonServer
from tests.e2e.test_learner_states_triton import _ready
from tests.integration.test_learner_states import SECRET, Learner, Served

pytestmark = pytest.mark.e2e
LEARNERS = 12


def _lost(served: Served) -> int:
    return int(served.metrics.registry.get_sample_value(
        "routerkt_state_lookups_total", {"model": "kt", "key": "learner", "result": "lost"}) or 0)


def _inferences(served: Served, replica: int) -> int:
    return int(served.metrics.registry.get_sample_value(
        "routerkt_triton_replica_inferences_total", {"replica": str(replica)}) or 0)


def _held(url: str, version: int, ref: int, length: int) -> bool:
    """Whether the Triton at `url` holds the state `ref` of that length (a held_next of one candidate answers)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(url)
    inputs = []
    for name, array in (("state_ref", np.array([[ref]])), ("state_length", np.array([[length]])),
                        ("candidate_questions", np.ones((1, 1))), ("candidate_skills", np.ones((1, 1, 1)))):
        inputs.append(grpcclient.InferInput(name, list(array.shape), "INT64"))
        inputs[-1].set_data_from_numpy(array.astype(np.int64))
    try:
        client.infer("kt", inputs, model_version=str(version),
                     outputs=[grpcclient.InferRequestedOutput("candidate_probs")])
        return True
    except InferenceServerException as exc:
        assert "state not held" in exc.message(), exc.message()
        return False
    finally:
        client.close()


def _scraped(metrics_url: str, name: str) -> float:
    """The sum of a metric's samples on a Triton's metrics port."""
    import urllib.request
    text = urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def _gaps(learners: list[Learner]) -> float:
    return max(learner.gap() for learner in learners)


def test_held_states_spread_over_replicas_answer_exactly_and_survive_a_lost_replica(kt_step_repository,
                                                                                    tmp_path) -> None:
    repository = kt_step_repository.path
    vocab = read_vocab(repository, "kt", latest_version(repository, "kt"))
    questions = [q for q, skills in sorted(vocab.question_skills.items()) if all(s in vocab.skills for s in skills)]
    skills = sorted(vocab.skills)
    tritons = [TritonServer(repository, log_path=tmp_path / f"triton-{i}.log", exit_timeout_s=3) for i in range(2)]
    starting = [threading.Thread(target=t.start, kwargs={"timeout": 120}) for t in tritons]
    for thread in starting:
        thread.start()
    for thread in starting:
        thread.join()
    held = sent = None
    try:
        assert all(t.is_running() for t in tritons), [t.log_tail(20) for t in tritons]
        held = Served(repository, tmp_path / "held.sqlite3", triton_url=",".join(t.grpc_url for t in tritons),
                      probe_interval_s=0.5)
        sent = Served(repository, tmp_path / "sent.sqlite3", triton_url=tritons[0].grpc_url, held_states=False)
        _ready(held)
        _ready(sent)
        learners = [Learner(held, f"held-{i}", questions, skills, seed=i) for i in range(LEARNERS)]
        for learner in learners:
            learner.observe(5)
        assert _gaps(learners) <= 1e-5                       # misses: held_start on the learner's replica
        assert _gaps(learners) <= 1e-5                       # hits: held_next, a key and the candidates
        for learner in learners:
            learner.observe(1)
        assert _gaps(learners) <= 1e-5                       # Observe's fill (held_append) or the Predict's
        assert held.lookups()["hit"] >= LEARNERS and _lost(held) == 0
        assert all(_inferences(held, i) > 0 for i in range(2)), "the learners' states on both replicas"
        held_there = [_scraped(t.metrics_url, "routerkt_triton_held_states") for t in tritons]
        assert all(n > 0 for n in held_there) and sum(held_there) >= LEARNERS, held_there     # Triton's gauges
        assert all(_scraped(t.metrics_url, "routerkt_triton_held_state_bytes") > 0 for t in tritons)

        alike = Learner(sent, "sent-0", questions, skills, seed=0)
        alike.observe(6)
        assert alike.gap() <= 1e-5
        (count, nbytes), (_, sent_bytes) = held.cached(), sent.cached()
        assert count == LEARNERS and nbytes / count < sent_bytes / 4   # a history and a key, not the state

        tritons[0].kill()                                    # its learners' states are gone with it
        assert _gaps(learners) <= 1e-5
        lost = _lost(held)
        assert 0 < lost < LEARNERS                           # only replica 0's learners were rebuilt (on 1)
        assert _gaps(learners) <= 1e-5 and _lost(held) == lost

        tritons[0] = TritonServer(repository, ports=tritons[0].ports, log_path=tmp_path / "triton-0b.log",
                                  exit_timeout_s=3)
        tritons[0].start(timeout=120)
        deadline = time.monotonic() + 30
        while not held.gateway.server.backend.ready_versions("kt") or not all(
                r.backend.ready_versions("kt") for r in held.gateway.server.backend.replicas):
            assert time.monotonic() < deadline, "the restarted replica never became ready again"
            time.sleep(0.1)
        assert _gaps(learners) <= 1e-5                       # back on replica 0, empty: rebuilt again
        assert _lost(held) > lost and _gaps(learners) <= 1e-5

        # ForgetLearner deletes the learner's states in Triton too: its key is answered NOT_FOUND there
        service = held.gateway.server.service
        model = service.catalog.get("kt", latest_version(repository, "kt"))
        entry = service.states.cache.peek("kt", model.version, LearnerKeys(SECRET).learner(learners[0].name))
        where = (service.backend.holder(model, entry.held & SLOT_MASK).name, model.version, entry.held,
                 int(entry.tensors["state_length"][0]))
        assert _held(*where)
        held.stub.ForgetLearner(pb.ForgetLearnerRequest(learner_id=learners[0].name), timeout=10.0)
        deadline = time.monotonic() + 10
        while _held(*where):
            assert time.monotonic() < deadline, "ForgetLearner left the learner's state in Triton"
            time.sleep(0.05)
    finally:
        for served in (held, sent):
            if served is not None:
                served.close()
        for triton in tritons:
            triton.stop()
