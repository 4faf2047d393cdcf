"""Observe's skill check (SessionService._skill_known): a raw skill id is known when some catalog
version's vocabulary has it; the union is rebuilt when the catalog's table changes, not per call."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from serving.sessions.session_service import SessionService

pytestmark = pytest.mark.unit


class Catalog:
    def __init__(self) -> None:
        self.table: dict = {}

    def snapshot(self) -> dict:
        return self.table

    def publish(self, name: str, version: int, skills: list[int]) -> None:
        table = {k: dict(v) for k, v in self.table.items()}          # a refresh builds a new table
        table.setdefault(name, {})[version] = SimpleNamespace(vocab=SimpleNamespace(skills={s: 2 + i for i, s in
                                                                                         enumerate(skills)}))
        self.table = table


def _service(catalog: Catalog) -> SessionService:
    service = SessionService.__new__(SessionService)
    service.catalog = catalog
    service._known_skills = (None, None)
    return service


def test_union_of_versions_and_refresh_on_change():
    catalog = Catalog()
    service = _service(catalog)
    raw = np.array([3, 5, 7, -1], dtype=np.int64)
    assert service._skill_known(raw).tolist() == [True] * 4             # empty catalog: nothing to check
    catalog.publish("kt", 1, [3, 5])
    assert service._skill_known(raw).tolist() == [True, True, False, False]
    cached = service._known_skills
    service._skill_known(raw)
    assert service._known_skills is cached                              # same table: not rebuilt
    catalog.publish("kt", 2, [7])
    assert service._skill_known(raw).tolist() == [True, True, True, False]
    catalog.publish("other", 1, [-5])
    assert service._skill_known(np.array([-5, 4])).tolist() == [True, False]
