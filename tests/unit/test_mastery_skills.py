"""Mastery's skill list (serving/queries/mastery.py) and the rank path's candidate widths (serving/encoder/window.py)."""
from __future__ import annotations

import numpy as np
import pytest

from routerkt.contract.vocab import Vocab
from serving.status_errors import ServingError
from serving.encoder.window import CANDIDATE_WIDTHS, candidate_width
from serving.queries.mastery import model_skills

VOCAB = Vocab(questions={100: 2, 101: 3}, skills={7: 2, 8: 3, 3: 4}, question_skills={100: (7,), 101: (8,)})


def test_every_skill_in_ascending_raw_id_order() -> None:
    raw, ids = model_skills(None, VOCAB)
    assert raw.tolist() == [3, 7, 8] and ids.tolist() == [4, 2, 3]
    raw, ids = model_skills(np.zeros(0, dtype=np.int64), VOCAB)
    assert raw.tolist() == [3, 7, 8]


def test_requested_skills_keep_their_order() -> None:
    raw, ids = model_skills(np.array([8, 3]), VOCAB)
    assert raw.tolist() == [8, 3] and ids.tolist() == [3, 4]


@pytest.mark.parametrize("skills, field", [([7, 99], "skill_ids[1]"), ([7, 8, 7], "skill_ids[2]"), ([-1], "skill_ids[0]")])
def test_bad_skills_name_the_field(skills, field) -> None:
    with pytest.raises(ServingError) as err:
        model_skills(np.array(skills), VOCAB)
    assert err.value.code_name == "INVALID_ARGUMENT" and err.value.field == field


def test_candidate_widths() -> None:
    assert [candidate_width(n) for n in (1, 2, 5, 9, 17, 20, 25, 33, 49, 64)] == [1, 4, 8, 16, 24, 24, 32, 48, 64, 64]
    assert candidate_width(115) == 120 and candidate_width(65) == 72
    assert all(candidate_width(w) == w for w in CANDIDATE_WIDTHS)
