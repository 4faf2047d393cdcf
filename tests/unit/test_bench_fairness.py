"""`routerkt bench fairness --vary`: which gateway setting it compares, typed like the Settings field."""
from __future__ import annotations

import pytest

from loadtest.bench.fairness import parse_vary
from routerkt.errors import UserError

pytestmark = pytest.mark.unit


def test_vary_parses_a_numeric_setting_and_its_values() -> None:
    assert parse_vary("bulk_pause_ratio=0,1.5") == ("bulk_pause_ratio", [0.0, 1.5])
    name, values = parse_vary("rank_candidates_per_infer=64,16")
    assert (name, values) == ("rank_candidates_per_infer", [64, 16]) and all(type(v) is int for v in values)
    assert parse_vary("") == ("", [None])                      # one gateway with the defaults


@pytest.mark.parametrize("spec", ["nonsense=1", "repository=1", "bulk_pause_ratio", "bulk_pause_ratio=",
                                  "max_inflight=1.5", "bulk_pause_ratio=fast"])
def test_vary_refuses_what_it_cannot_compare(spec: str) -> None:
    with pytest.raises(UserError, match="--vary"):
        parse_vary(spec)


def test_pooled_summary_pools_the_rounds_and_gives_each_rounds_ratio() -> None:
    from loadtest.bench.fairness import pooled
    rounds = [{"alone": [0.010] * 100, "beside maximal batches": [0.015] * 100, "batches": [2.0]},
              {"alone": [0.020] * 100, "beside maximal batches": [0.020] * 100, "batches": [3.0, 4.0]}]
    line = pooled(rounds)
    assert "small p99 alone 20.0 ms, beside 20.0 ms: 1.00x" in line           # pooled: the worse round's tail
    assert "(per round 1.50x, 1.00x)" in line and "median 3.00 s (3 calls)" in line
