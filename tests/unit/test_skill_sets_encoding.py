"""Skill SETS inside the gateway (serving/encoder/window.py, catalog.py, sessions/store.py): sets mapped to
model ids [n, K] (absent sets looked up from the vocabulary's question_skills), the served graphs'
skill tensors with K = the widest set of the inference, versions exported before skill sets fed
each set's first skill, and stored events read back as sets."""
from __future__ import annotations

import numpy as np
import pytest

from routerkt.contract.signature import NO_SKILL, PAD_ID, RANK, SCORE, UNK_ID, zero_inputs
from routerkt.contract.vocab import Vocab
from serving.core.catalog import ModelVersion, _skill_sets
from serving.encoder.window import WindowEncoder, encode_learner
from serving.core.calls import LearnerQuery, PredictQuery
from serving.sessions.store import History, StoredEvent, parse_skills
from serving.settings import Settings
from serving.core.validation import validate_query

pytestmark = pytest.mark.unit

# raw skills 7 -> 2, 8 -> 3, 9 -> 4; question 101 is tagged with two skills, 103 never had one
VOCAB = Vocab(questions={100: 2, 101: 3, 102: 4, 103: 5}, skills={7: 2, 8: 3, 9: 4},
              question_skills={100: (7,), 101: (8, 9), 102: (7,), 103: (-1,)})
SINGLE = Vocab(questions={100: 2, 101: 3}, skills={7: 2, 8: 3}, question_skill={100: 7, 101: 8})


def learner(history, candidates, prefix: str = ""):
    query = PredictQuery(model="m", version=0, learners=[LearnerQuery.from_values(history, candidates)])
    validated = validate_query(query, Settings().validate())[0]
    validated.prefix = prefix
    return validated


def model(graph=SCORE, window: int = 5, skill_sets: bool = True, vocab: Vocab = VOCAB) -> ModelVersion:
    return ModelVersion(name="m", version=1, window=window, max_batch_size=64, vocab=vocab, graph=graph,
                        skill_sets=skill_sets)


def test_sets_map_to_model_ids_and_absent_sets_come_from_the_vocabulary():
    counts: dict[str, int] = {}
    enc = encode_learner(learner([(100, [7, 9], 1), (101, None, 0), (103, None, 1), (100, -1, 0)],
                                 [(102, None), (999, [8, -1])]), VOCAB, 8,
                         lambda kind, n: counts.__setitem__(kind, counts.get(kind, 0) + n))
    assert enc.skills.tolist() == [[2, 4], [3, 4], [UNK_ID, PAD_ID], [UNK_ID, PAD_ID]]
    assert enc.candidate_skills.tolist() == [[2, PAD_ID], [3, UNK_ID]]
    assert counts == {"skill": 3, "question": 1}
    assert enc.width == 2


def test_single_skill_traffic_stays_one_column():
    enc = encode_learner(learner([(100, 7, 1), (101, None, 0)], [(100, None)]), SINGLE, 5)
    assert enc.skills.tolist() == [[2], [3]] and enc.candidate_skills.tolist() == [[2]]
    only_absent = encode_learner(learner([(100, None, 1)], [(102, None)]), VOCAB, 5)
    assert only_absent.skills.shape == (1, 1) and only_absent.candidate_skills.shape == (1, 1)


def _minus_one_for(unknown: set[int], skills):
    """`skills` (None, one id or a list) with every id of `unknown` written as -1."""
    if isinstance(skills, list):
        return [-1 if s in unknown else s for s in skills]
    return -1 if skills in unknown else skills


@pytest.mark.parametrize("history, candidates, history_skills, candidate_skills", [
    ([(100, [7, 42], 1)], [(100, None)], [[2, UNK_ID]], [[2]]),
    ([(100, 7, 1), (100, 42, 1)], [(100, None)], [[2], [UNK_ID]], [[2]]),
    ([], [(100, None), (100, [9, 8, 77])], [], [[2, PAD_ID, PAD_ID], [4, 3, UNK_ID]]),
])
def test_unknown_skills_map_to_the_unknown_id_like_unknown_questions(history, candidates, history_skills,
                                                                     candidate_skills):
    """A skill the version does not know (one the platform added later) is UNK_ID in its slot, counted,
    exactly as -1 there would be."""
    counts: dict[str, int] = {}
    enc = encode_learner(learner(history, candidates, "learners[2]."), VOCAB, 5,
                         lambda kind, n: counts.__setitem__(kind, counts.get(kind, 0) + n))
    assert enc.skills.tolist() == history_skills and enc.candidate_skills.tolist() == candidate_skills
    assert counts == {"skill": 1}
    unknown = {42, 77}
    same = encode_learner(learner([(q, _minus_one_for(unknown, s), c) for q, s, c in history],
                                  [(q, _minus_one_for(unknown, s)) for q, s in candidates]), VOCAB, 5)
    assert same.skills.tolist() == history_skills and same.candidate_skills.tolist() == candidate_skills


def test_score_rows_have_the_widest_set_of_the_inference():
    encoder = WindowEncoder()
    narrow = encoder.encode(learner([(100, 7, 1)], [(100, None)]), model())
    wide = encoder.encode(learner([(100, [7, 8, 9], 1)], [(101, None), (102, None)]), model())
    [inference] = encoder.inferences([narrow, wide], model(), rows_limit=64)
    q, s, r = (inference.feeds[name] for name in SCORE.input_names)
    assert q.shape == r.shape == (3, 5) and s.shape == (3, 5, 3)
    assert s[0].tolist() == [[0, 0, 0]] * 3 + [[2, 0, 0], [2, 0, 0]]
    assert s[1, 3:].tolist() == [[2, 3, 4], [3, 4, 0]] and s[2, 4].tolist() == [2, 0, 0]
    [alone] = encoder.inferences([narrow], model(), rows_limit=64)
    assert alone.feeds["skills"].shape == (1, 5, 1)


def test_rank_inputs_pad_history_and_candidates_to_one_width():
    encoder = WindowEncoder()
    rank = model(RANK)
    a = encoder.encode(learner([(100, 7, 1)], [(101, None)]), rank)
    b = encoder.encode(learner([], [(100, [9, 8])]), rank)
    [inference] = encoder.inferences([a, b], rank, rows_limit=64)
    feeds = inference.feeds
    assert feeds["history_skills"].shape == (2, 4, 2) and feeds["candidate_skills"].shape == (2, 1, 2)
    assert feeds["history_skills"][0, -1].tolist() == [2, PAD_ID] and not feeds["history_skills"][1].any()
    assert feeds["candidate_skills"][:, 0].tolist() == [[3, 4], [4, 3]]


@pytest.mark.parametrize("graph", [SCORE, RANK])
def test_versions_exported_before_skill_sets_get_each_sets_first_skill(graph):
    encoder = WindowEncoder()
    old, new = model(graph, skill_sets=False), model(graph)
    enc = encoder.encode(learner([(100, [9, 7], 1), (101, None, 0)], [(101, None)]), new)
    [legacy] = encoder.inferences([enc], old, rows_limit=64)
    [current] = encoder.inferences([enc], new, rows_limit=64)
    for spec in graph.inputs:
        if spec.axes[-1] == "skills":
            assert legacy.feeds[spec.name].shape == current.feeds[spec.name].shape[:-1]
            assert legacy.feeds[spec.name].tolist() == current.feeds[spec.name][..., 0].tolist()
            assert legacy.feeds[spec.name].flags["C_CONTIGUOUS"]
        else:
            assert legacy.feeds[spec.name].tolist() == current.feeds[spec.name].tolist()
    assert model(graph, skill_sets=False).probe_inputs()[graph.inputs[1].name].ndim == 2
    assert model(graph).probe_inputs()[graph.inputs[1].name].ndim == 3


def test_catalog_tells_new_exports_from_old_ones():
    window = 6
    new = {t.name: d for t, d in zip(RANK.inputs, [(5,), (5, -1), (5,), (-1,), (-1, -1)])}
    old = {t.name: d for t, d in zip(RANK.inputs, [(5,), (5,), (5,), (-1,), (-1,)])}
    assert _skill_sets(RANK, window, new) is True
    assert _skill_sets(RANK, window, old) is False
    assert _skill_sets(RANK, window + 1, old) is None
    assert _skill_sets(SCORE, window, {"questions": (6,), "skills": (6, -1), "responses": (6,)}) is True
    assert _skill_sets(SCORE, window, {"questions": (6,), "skills": (6,), "responses": (6,)}) is False
    assert set(zero_inputs(SCORE, window)) == set(model(SCORE, window, skill_sets=False).probe_inputs())


def test_stored_events_read_back_as_sets():
    events = [StoredEvent("k", 1, (3, 17), 1), StoredEvent("k", 2, 5, 0), StoredEvent("k", 3, -2, 1),
              StoredEvent("k", 4, (), 1)]
    assert [e.skills for e in events] == [(3, 17), (5,), (), ()]
    assert [e.skill_text for e in events] == ["3;17", "5", "-2", "-2"]
    assert [parse_skills(e.skill_text) for e in events] == [(3, 17), (5,), (), ()]
    history = History.from_rows([(e.question_id, e.first_skill, e.correct) for e in events], {0: (3, 17)})
    assert history.skills.tolist() == [[3, 17], [5, -2], [-2, -2], [-2, -2]]
    assert History.from_rows([(1, 5, 1)]).skills.shape == (1, 1)
    assert History.empty().skills.shape == (0, 1)


@pytest.mark.parametrize("vocab", [VOCAB, SINGLE], ids=["sets", "single"])
def test_the_small_rows_path_maps_exactly_as_the_array_path(vocab):
    from serving.encoder.window import _map_arrays, _map_small
    rng = np.random.default_rng(7)
    raw_ids = [100, 101, 102, 103, 999, -1]
    skill_ids = [7, 8, 9, 55, -1]
    for _ in range(400):
        n, width = int(rng.integers(0, 17)), int(rng.integers(1, 4))
        questions = np.array(rng.choice(raw_ids, n), dtype=np.int64)
        skills = np.full((n, width), NO_SKILL, dtype=np.int64)
        for k in range(n):
            used = int(rng.integers(0, width + 1))          # 0: absent (looked up from the vocabulary)
            skills[k, :used] = rng.choice(skill_ids, used)
        small, arrays = _map_small(questions, skills, vocab), _map_arrays(questions, skills, vocab)
        assert small[0].dtype == arrays[0].dtype == np.int64 and small[1].dtype == np.int64
        assert np.array_equal(small[0], arrays[0]) and small[1].shape == arrays[1].shape
        assert np.array_equal(small[1], arrays[1]) and small[2:] == arrays[2:]
