"""serving/metrics/ (__init__.py, grpc_calls.py): the promised metric names and labels, one registry per test."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from serving.metrics import METRIC_NAMES, Metrics, labelled
from serving.metrics.grpc_calls import split_method

pytestmark = pytest.mark.unit


def exposed_names(metrics: Metrics) -> set[str]:
    """Names as scraped: counters with their _total suffix, histograms and gauges as they are."""
    names = set()
    for family in metrics.registry.collect():
        names.add(family.name + "_total" if family.type == "counter" else family.name)
    return names


def test_registry_holds_exactly_the_documented_names() -> None:
    assert exposed_names(Metrics(CollectorRegistry())) == set(METRIC_NAMES)


@pytest.mark.parametrize("name", ["grpc_server_started_total", "grpc_server_handled_total",
                                  "grpc_server_handling_seconds", "routerkt_triton_request_seconds",
                                  "routerkt_history_length", "routerkt_candidates_per_call",
                                  "routerkt_unknown_ids_total", "routerkt_errors_total", "routerkt_inflight_requests",
                                  "routerkt_model_reloads_total", "routerkt_model_ready"])
def test_promised_names_exist(name: str) -> None:
    assert name in METRIC_NAMES


def test_each_instance_has_its_own_registry() -> None:
    first, second = Metrics(), Metrics()
    first.errors.labels(code="NOT_FOUND").inc()
    assert first.registry.get_sample_value("routerkt_errors_total", {"code": "NOT_FOUND"}) == 1.0
    assert second.registry.get_sample_value("routerkt_errors_total", {"code": "NOT_FOUND"}) is None


def test_labels_carry_no_learner_information() -> None:
    metrics = Metrics()
    labels = {family.name: {label for sample in family.samples for label in sample.labels}
              for family in metrics.registry.collect()}
    metrics.grpc_handled.labels(grpc_service="s", grpc_method="m", grpc_type="unary", grpc_code="OK").inc()
    metrics.reloads.labels(model="kt", reason="stub_crash").inc()
    allowed = {"grpc_service", "grpc_method", "grpc_type", "grpc_code", "model", "reason", "kind", "code",
               "handler", "status", "le", "version", "git_sha", "operation", "result", "method"}   # version: model or build
    for family in metrics.registry.collect():
        for sample in family.samples:
            assert set(sample.labels) <= allowed, (family.name, sample.labels)
    assert labels["routerkt_unknown_ids"] == {"kind"}       # zero series exposed before any unknown id


def test_latency_buckets_suit_milliseconds() -> None:
    metrics = Metrics()
    metrics.triton_seconds.labels(model="kt", version="1").observe(0.003)
    buckets = [s.labels["le"] for s in metrics.registry.collect() for s in s.samples
               if s.name == "routerkt_triton_request_seconds_bucket"]
    assert sum(1 for le in buckets if le != "+Inf" and float(le) <= 0.01) >= 5


def test_split_method() -> None:
    assert split_method("/routerkt.v1.KnowledgeTracingService/Predict") == ("routerkt.v1.KnowledgeTracingService", "Predict")
    assert split_method("weird") == ("unknown", "weird")


def test_labelled_children_are_the_metrics_own_and_looked_up_once() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    seconds = labelled(metrics.store_seconds)
    first = seconds(operation="history")
    assert seconds(operation="history") is first is metrics.store_seconds.labels(operation="history")
    first.observe(0.002)
    seconds(operation="history_since").observe(0.001)
    assert registry.get_sample_value("routerkt_store_seconds_count", {"operation": "history"}) == 1
    assert registry.get_sample_value("routerkt_store_seconds_count", {"operation": "history_since"}) == 1
    assert seconds.cache_info().misses == 2 and seconds.cache_info().hits == 1
