"""serving/pipeline/admission.py: the per-call cost budget and deadline-aware shedding."""
from __future__ import annotations

import pytest

from serving.pipeline.admission import ServiceTime, check_budget
from serving.status_errors import ServingError
from serving.settings import Settings

pytestmark = pytest.mark.unit


def test_a_call_over_the_budget_is_refused_naming_the_field() -> None:
    settings = Settings(max_call_rows=1000)
    check_budget(1000, settings, batch=True)
    with pytest.raises(ServingError) as info:
        check_budget(1001, settings, batch=True)
    assert info.value.code_name == "INVALID_ARGUMENT" and info.value.field == "learners"
    assert "1001 rows" in info.value.message and "split" in info.value.message
    with pytest.raises(ServingError) as info:
        check_budget(1001, settings, batch=False)
    assert info.value.field == "candidates"


def test_shedding_refuses_only_under_load_and_only_what_cannot_make_its_deadline() -> None:
    settings = Settings(shed_min_inflight=4)
    estimate = ServiceTime()
    estimate.admit(100, 0.001, inflight=50, settings=settings)          # no estimate yet: admitted
    for _ in range(20):
        estimate.add(rows=100, seconds=0.5)                          # 5 ms per row
    assert estimate.expected(100) == pytest.approx(0.5)
    estimate.admit(100, 0.8, inflight=50, settings=settings)            # 1.5 x 0.5 s expected < 0.8 s left
    with pytest.raises(ServingError) as info:
        estimate.admit(100, 0.7, inflight=50, settings=settings)
    assert info.value.code_name == "RESOURCE_EXHAUSTED" and "overloaded" in info.value.message
    estimate.admit(100, 0.4, inflight=3, settings=settings)             # light load: always admitted


def test_the_estimate_follows_the_load_down() -> None:
    estimate = ServiceTime()
    for _ in range(20):
        estimate.add(rows=10, seconds=1.0)
    for _ in range(30):
        estimate.add(rows=10, seconds=0.01)
    assert estimate.expected(10) < 0.02


def test_shedding_is_off_by_default() -> None:
    estimate = ServiceTime()
    estimate.add(rows=10, seconds=10.0)
    estimate.admit(10, 0.001, inflight=1000, settings=Settings())
