"""Tests of training/paper/variants.py (reproduce variants as data: run folder names unchanged, so the
committed results/ runs are still found) and of the one leaking-routing rule, ModelConfig.leaks_future."""
from __future__ import annotations

from pathlib import Path

import pytest

from training.config import HeadMode, ModelConfig, RoutingScope
from training.paper.variants import BASELINE, GROUPS, Variant, expand

pytestmark = pytest.mark.unit

RESULTS = Path(__file__).resolve().parents[2] / "results"


def test_a_variant_is_a_preset_and_overrides():
    v = Variant.parse("routerkt-akt+model.routing_scope=token")
    assert v == Variant("routerkt-akt", ("model.routing_scope=token",))
    assert str(v) == "routerkt-akt+model.routing_scope=token"
    assert v.folder == "routerkt-akt+routing_scope=token"
    assert Variant.parse("dkt + train.batch_size=64").folder == "dkt+batch_size=64"
    assert Variant("akt", ("data.folds_file=a b.json",)).folder == "akt+folds_file=a_b.json"


def test_expand_groups_and_variants_in_order_without_repeats():
    assert expand("akt, routerkt-akt,akt") == [Variant("akt"), BASELINE]
    assert expand("ablations")[0] == Variant("routerkt-akt", ("model.routing_scope=token",))
    assert len(expand("main,akt-family")) == len(GROUPS["main"])


def test_the_all_group_has_every_preset():
    from training.models.registry import PRESETS
    assert {v.preset for v in GROUPS["all"]} == set(PRESETS)


def test_the_chunks_group_runs_every_variant_and_its_control_under_the_chunks_protocol():
    from training.config import Protocol
    from training.models.registry import dense_control, run_config
    variants = GROUPS["chunks"]
    assert {v.preset for v in variants} >= {"akt", "routerkt-akt"}            # what issue 15 asks for
    for v in variants:
        assert run_config(v.preset, "toy.csv", v.overrides).data.protocol is Protocol.CHUNKS
        assert dense_control(v.preset) in {None, *(w.preset for w in variants)}   # its paired row exists


def test_committed_runs_are_found_under_their_folder_names():
    if not RESULTS.is_dir():
        pytest.skip("no results/ folder")
    committed = {p.parent.name for p in RESULTS.glob("*/*/metrics.json")}
    folders = {v.folder for group in GROUPS.values() for v in group}
    assert committed <= folders, committed - folders
    assert {"routerkt-akt+routing_scope=sequence", "dkt+batch_size=64", "routerkt-akt+balance_beta=0.001"} <= committed


@pytest.mark.parametrize("heads", list(HeadMode))
@pytest.mark.parametrize("scope", list(RoutingScope))
def test_only_routing_over_the_whole_window_leaks_the_future(heads, scope):
    leaks = ModelConfig(heads=heads, routing_scope=scope).leaks_future
    assert leaks == (heads is HeadMode.ROUTER and scope is RoutingScope.SEQUENCE)
