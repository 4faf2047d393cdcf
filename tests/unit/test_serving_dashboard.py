"""serving/dashboards/routerkt-grafana.json: valid JSON, the promised panels, and every metric name
in its PromQL either defined in serving/metrics.py (routerkt_*, grpc_*) or a documented Triton metric."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from serving.metrics import METRIC_NAMES, TRITON_METRICS

pytestmark = pytest.mark.unit

DASHBOARD = Path(__file__).resolve().parents[2] / "serving" / "dashboards" / "routerkt-grafana.json"
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
SUFFIXES = ("_bucket", "_sum", "_count")


def promql_metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (strings, label matchers, ranges and grouping removed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)                       # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)                                # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)                               # range selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group(0)
        following = text[match.end():].lstrip()[:1]
        if following == "(" or word in KEYWORDS or word.lower() in ("inf", "nan"):
            continue                                                      # functions, keywords
        if match.start() > 0 and (text[match.start() - 1].isdigit() or text[match.start() - 1] == "."):
            continue                                                      # exponent of 1e-9
        names.add(word)
    return names


def base_name(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def all_panels(dashboard: dict) -> list[dict]:
    panels = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return panels


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in all_panels(dashboard) for t in p.get("targets", [])]


def test_parser_extracts_names() -> None:
    expr = ('histogram_quantile(0.99, sum by (le, grpc_method) (rate(grpc_server_handling_seconds_bucket'
            '{grpc_service="a", grpc_code!="OK"}[$__rate_interval]))) / clamp_min(foo_total, 1e-9) > bool 0')
    assert promql_metric_names(expr) == {"grpc_server_handling_seconds_bucket", "foo_total"}


def test_every_metric_in_the_dashboard_is_defined(dashboard: dict) -> None:
    seen = set()
    for expr in exprs(dashboard):
        for name in promql_metric_names(expr):
            seen.add(name)
            candidates = {name, base_name(name)}          # nv_inference_count is a name, not a suffix
            if name.startswith(("routerkt_", "grpc_")):
                assert candidates & (set(METRIC_NAMES) | set(TRITON_METRICS)), (name, expr)
            elif name.startswith("nv_"):
                assert candidates & set(TRITON_METRICS), (name, expr)
            else:
                pytest.fail(f"unexpected metric {name!r} in {expr!r}")
    assert seen, "no expressions found"


def test_promised_panels_are_there(dashboard: dict) -> None:
    names = {base_name(n) for e in exprs(dashboard) for n in promql_metric_names(e)}
    for needed in ("grpc_server_handled_total", "grpc_server_handling_seconds", "routerkt_triton_request_seconds",
                   "routerkt_candidates_per_call", "routerkt_history_length", "routerkt_unknown_ids_total",
                   "routerkt_errors_total", "routerkt_inflight_requests", "routerkt_model_reloads_total",
                   "routerkt_model_ready", "nv_inference_request_success", "nv_inference_queue_duration_us",
                   "routerkt_outcome_log_loss", "routerkt_outcome_brier", "routerkt_online_reliability",
                   "routerkt_online_auc", "routerkt_outcomes_total"):
        assert needed in names, needed
    quantiles = " ".join(e for e in exprs(dashboard) if "grpc_server_handling_seconds" in e)
    for q in ("0.5", "0.95", "0.99"):
        assert f"histogram_quantile({q}," in quantiles


def test_panels_have_unique_ids_and_a_datasource(dashboard: dict) -> None:
    ids = [p["id"] for p in all_panels(dashboard)]
    assert len(ids) == len(set(ids))
    for panel in all_panels(dashboard):
        if panel["type"] != "row":
            assert panel["datasource"]["type"] == "prometheus" and panel["targets"], panel["title"]
