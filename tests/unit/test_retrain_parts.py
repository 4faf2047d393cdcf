"""The retrain's parts without a store or a model: the forward-in-time split, the scoring windows, the grown vocabulary and the warm start's row mapping."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from loop.retrain.data import Split, filled_timestamps, grown_vocab, split_events
from loop.retrain.score import windows
from loop.retrain.warm import warm_state
from routerkt.contract.vocab import Vocab
from routerkt.errors import UserError

pytestmark = pytest.mark.unit


def _csv(path, rows) -> None:
    lines = ["user_id,order,question_id,skill_id,correct,timestamp_ms"]
    lines += [",".join(map(str, r)) for r in rows]
    path.write_text("\n".join(lines) + "\n")


def test_each_learner_is_split_at_its_first_event_at_or_after_the_cutoff(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("loop.retrain.data.MIN_TRAIN_EVENTS", 1)
    monkeypatch.setattr("loop.retrain.data.MIN_TRAIN_LEARNERS", 1)
    monkeypatch.setattr("loop.retrain.data.MIN_HELDOUT_EVENTS", 1)
    rows = [(7, 0, 10, "1;2", 1, 100), (7, 1, 11, 1, 0, -1), (7, 2, 12, 1, 1, 300), (7, 3, 13, 1, 0, 250),
            (9, 0, 10, 1, 0, 50), (9, 1, 11, 1, 1, 400)]
    _csv(tmp_path / "events.csv", rows)
    split = split_events(tmp_path / "events.csv", tmp_path / "train.csv", cutoff_ms=200)
    # learner 7: 100, (100), 300 -> held out from the third on, the 250 after it too (store order)
    assert split.heldout.tolist() == [False, False, True, True, False, True]
    assert split.skill_id[0].tolist() == [1, 2]
    assert (tmp_path / "train.csv").read_text().splitlines()[1:] == ["7,0,10,1;2,1", "7,1,11,1,0", "9,0,10,1,0"]
    assert filled_timestamps(np.array([1, 1, 2]), np.array([-1, 5, -1])).tolist() == [-1, 5, -1]
    with pytest.raises(UserError, match="too few events"):
        split_events(tmp_path / "events.csv", tmp_path / "train.csv", cutoff_ms=10)     # nothing to train on


def test_without_timestamps_the_last_fifth_of_each_learner_is_held_out(tmp_path, monkeypatch) -> None:
    for name in ("MIN_TRAIN_EVENTS", "MIN_TRAIN_LEARNERS", "MIN_HELDOUT_EVENTS"):
        monkeypatch.setattr(f"loop.retrain.data.{name}", 1)
    rows = [(u, t, t, 1, (t + u) % 2, -1) for u in (1, 2) for t in range(10)]
    _csv(tmp_path / "events.csv", rows)
    split = split_events(tmp_path / "events.csv", tmp_path / "train.csv", cutoff_ms=None)
    assert split.heldout.reshape(2, 10).sum(axis=1).tolist() == [2, 2] and split.heldout.reshape(2, 10)[:, -2:].all()


def test_windows_score_every_held_out_row_once_with_half_a_window_of_context() -> None:
    user = np.repeat([1, 2], [30, 7])
    heldout = np.concatenate([np.arange(30) >= 12, np.arange(7) >= 3])
    split = Split(user, np.zeros(37, dtype=np.int64), np.zeros((37, 1), dtype=np.int64), np.zeros(37, dtype=np.int64),
                  heldout, 0, None)
    spans = windows(split, window=8)
    scored = [row for a, b, first in spans for row in range(first, b)]
    assert sorted(scored) == np.flatnonzero(heldout).tolist()
    for a, b, first in spans:
        assert b - a <= 8 and (first - a >= 4 or a in (0, 30))       # >= half a window, or the learner's start


def test_the_grown_vocabulary_keeps_every_served_id_and_adds_the_new_ones() -> None:
    served = Vocab({10: 2, 30: 3}, {1: 2}, question_skills={10: (1,), 30: (1,)})
    data = Vocab({10: 2, 20: 3, 40: 4}, {1: 2, 5: 3}, question_skills={10: (5,), 20: (5,), 40: (1,)})
    vocab, counts = grown_vocab(served, data)
    assert vocab.questions == {10: 2, 20: 3, 30: 4, 40: 5} and vocab.skills == {1: 2, 5: 3}
    assert counts == {"new_questions": 2, "new_skills": 1, "questions": 4, "skills": 2}
    assert vocab.question_skills[10] == (1,) and vocab.question_skills[20] == (5,)


def test_a_skill_no_served_version_knows_gets_an_id_from_the_exported_events(tmp_path, monkeypatch) -> None:
    """Observe stores skills the served version does not know and `routerkt sessions export` writes them
    (`1;9`): the retrain's grown vocabulary (built from the training rows as retrain_train does) gives them
    ids and counts them. A question the served version knows keeps its served skill set; a new question
    takes the set it was answered with, new skill included."""
    for name in ("MIN_TRAIN_EVENTS", "MIN_TRAIN_LEARNERS", "MIN_HELDOUT_EVENTS"):
        monkeypatch.setattr(f"loop.retrain.data.{name}", 1)
    from training.config import DataConfig
    from training.data.pipeline import load_interactions
    served = Vocab({10: 2, 11: 3}, {1: 2, 2: 3}, question_skills={10: (1,), 11: (2,)})
    rows = [(7, 0, 10, "1;9", 1, 100), (7, 1, 20, 9, 0, 110), (7, 2, 11, 2, 1, 120), (7, 3, 21, -1, 0, 130),
            (7, 4, 20, 9, 1, 300), (8, 0, 11, 2, 0, 105), (8, 1, 10, 1, 0, 310)]
    _csv(tmp_path / "events.csv", rows)
    split = split_events(tmp_path / "events.csv", tmp_path / "train.csv", cutoff_ms=200)
    assert split.heldout.tolist() == [False] * 4 + [True, False, True]
    vocab, counts = grown_vocab(served, Vocab.build(load_interactions(DataConfig(path=str(tmp_path / "train.csv")))))
    assert vocab.skills == {1: 2, 2: 3, 9: 4} and vocab.questions == {10: 2, 11: 3, 20: 4, 21: 5}
    assert counts == {"new_questions": 2, "new_skills": 1, "questions": 4, "skills": 3}
    assert vocab.question_skills[10] == (1,) and vocab.question_skills[11] == (2,)     # the served sets stay
    assert vocab.question_skills[20] == (9,) and vocab.question_skills[21] == (-1,)   # new: as answered
    assert vocab.encode_skills(np.array([[1, 9]])).tolist() == [[2, 4]]                # no longer the unknown id


def test_warm_state_copies_known_rows_to_their_new_ids_and_leaves_new_rows_fresh() -> None:
    old_vocab = Vocab({10: 2, 30: 3}, {1: 2}, question_skills={10: (1,), 30: (1,)})
    new_vocab, _ = grown_vocab(old_vocab, Vocab({20: 2}, {1: 2}, question_skills={20: (1,)}))   # 20 lands between
    old = {"difficulty.weight": torch.tensor([[0.0], [1.0], [10.0], [30.0]]), "skill.weight": torch.full((3, 2), 7.0),
           "head.weight": torch.full((2, 2), 3.0)}
    fresh = {"difficulty.weight": torch.full((5, 1), -1.0), "skill.weight": torch.zeros(3, 2),
             "head.weight": torch.zeros(2, 2), "new.bias": torch.zeros(1)}
    warm = warm_state(fresh, old, old_vocab, new_vocab)
    assert warm.state["difficulty.weight"].flatten().tolist() == [0.0, 1.0, 10.0, -1.0, 30.0]
    assert warm.state["skill.weight"].eq(7.0).all() and warm.state["head.weight"].eq(3.0).all()
    assert (warm.copied, warm.row_mapped, warm.fresh) == (2, 1, ["new.bias"])


@pytest.mark.parametrize("preset, overrides, context, protocol", [
    ("routerkt-akt", [], "band", "whole"),                                 # a band model by default
    ("routerkt-akt", ["model.context=window"], "window", "chunks"),
    ("akt", [], "window", "chunks"),
    ("akt", ["data.protocol=recent"], "window", "recent"),                 # --set wins
])
def test_a_retrain_trains_as_its_model_serves(tmp_path, preset, overrides, context, protocol) -> None:
    """A band model's retrain trains on whole histories (the only protocol it accepts), a window model's on every
    window of the training rows; --set data.protocol overrides both."""
    from loop.retrain.train import build_config
    from routerkt.contract.model_info import ModelInfo
    cfg = build_config(ModelInfo(name="kt", window=20, preset=preset), None, None, tmp_path / "train.csv", 2,
                       overrides)
    assert (cfg.model.context.value, cfg.data.protocol.value) == (context, protocol)
