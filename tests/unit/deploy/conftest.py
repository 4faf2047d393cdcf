"""Fixtures of the serving/deploy/ tests: the code's sources of truth (Settings' defaults, the
gateway's HTTP routes) and the deployments as loaded (the Kubernetes base's objects, compose's file).
The shared loaders and checks are in tests/unit/deploy/manifests.py."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from serving.settings import Settings


@pytest.fixture(scope="module")
def defaults() -> Settings:
    return Settings()


@pytest.fixture(scope="module")
def routes() -> dict[str, str]:
    """Route name -> path of the gateway's HTTP app (livez, readyz, prometheus, ...)."""
    from serving.metrics import Metrics
    from serving.security.guard import Guard
    from serving.transport.http_api import create_app

    stub = SimpleNamespace(service=SimpleNamespace(settings=Settings(), metrics=Metrics()), sessions=None,
                           recommender=None, policy=None, health=None, guard=Guard())
    app = create_app(stub)
    return {route.name: route.path for route in app.routes if hasattr(route, "path")}


@pytest.fixture(scope="module")
def objects() -> dict[tuple[str, str], dict]:
    """(kind, name) -> object, for every object of the base (kubectl apply -k serving/deploy/k8s)."""
    from tests.unit.deploy.manifests import k8s_objects
    table: dict[tuple[str, str], dict] = {}
    for path, doc in k8s_objects():
        key = (doc["kind"], doc["metadata"]["name"])
        assert key not in table, f"{key} defined twice"
        table[key] = doc
    return table


@pytest.fixture(scope="module")
def compose() -> dict:
    from tests.unit.deploy.manifests import COMPOSE, load_docs
    (doc,) = load_docs(COMPOSE)
    return doc
