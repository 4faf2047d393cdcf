"""The learner router (serving/deploy/k8s/haproxy.cfg, router.yaml, compose's `router`), checked offline: it
balances on the header the Python client sends, by consistent hashing; Kubernetes and compose set every variable
the config reads, name the gateways' gRPC port and enough slots for the gateway autoscaler's maximum, and hand it
its key beside its certificate. (tests/integration/test_learner_routing.py runs the same file in a real HAProxy.)"""
from __future__ import annotations

import re

import pytest

from serving.client import ROUTE_HEADER
from serving.settings import Settings
from tests.unit.deploy.manifests import K8S, container_port, load_docs, only, pod_spec, selected

pytestmark = pytest.mark.unit

CONFIG = (K8S / "haproxy.cfg").read_text()
FIXED = {f"ROUTERKT_GATEWAY_{k}" for k in range(1, 5)}   # the branch without DNS (a fixed list of gateways)


def variables() -> set[str]:
    """Every environment variable the config reads, but the fixed list's."""
    return set(re.findall(r"\$\{([A-Z0-9_]+)\}", CONFIG)) - FIXED


def test_the_config_hashes_the_clients_route_header() -> None:
    assert re.search(rf"^\s*balance hdr\({re.escape(ROUTE_HEADER)}\)\s*$", CONFIG, re.M)
    assert re.search(r"^\s*hash-type consistent\s*$", CONFIG, re.M)
    assert re.search(r"default-server ssl verify required ", CONFIG), "the router must verify the gateways"
    assert not re.search(r"^\s*(option\s+(http|tcp)log|log\s)", CONFIG, re.M), "no access log (headers)"


def test_kubernetes_router_reaches_every_gateway(objects: dict, defaults: Settings) -> None:
    router = only(objects, "router")
    (container,) = pod_spec(router)["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert variables() <= set(env), variables() - set(env)
    host, port = env["ROUTERKT_GATEWAY_DNS"].rsplit(":", 1)
    headless = objects[("Service", host)]
    assert headless["spec"]["clusterIP"] == "None"
    gateway = only(objects, "gateway")
    assert selected(objects, headless["spec"]["selector"]) == [gateway]
    assert int(port) == container_port(gateway, "grpc") == defaults.grpc_port
    hpa = objects[("HorizontalPodAutoscaler", gateway["metadata"]["name"])]
    assert int(env["ROUTERKT_GATEWAY_SLOTS"]) >= hpa["spec"]["maxReplicas"]
    assert env["ROUTERKT_ROUTER_BIND"] == f":{container_port(router, 'grpc')}"
    cert = env["ROUTERKT_ROUTER_TLS_CERT"]
    assert cert.endswith(".crt")
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    (tls,) = [v for v in pod_spec(router)["volumes"] if v["name"] == "tls"]
    files = {f"{mounts['tls']}/{item['path']}" for item in tls["secret"]["items"]}
    assert {cert, cert[:-4] + ".key", env["ROUTERKT_TLS_CA"]} <= files
    config_volume = [v for v in pod_spec(router)["volumes"] if v["name"] == "config"][0]
    (kustomization,) = load_docs(K8S / "kustomization.yaml")
    generated = {g["name"]: g["files"] for g in kustomization["configMapGenerator"]}
    assert generated[config_volume["configMap"]["name"]] == ["haproxy.cfg"]
    assert f"{mounts['config']}/haproxy.cfg" in container["command"]


def test_compose_router_reaches_the_gateway(compose: dict, defaults: Settings) -> None:
    router = compose["services"]["router"]
    env = router["environment"]
    assert variables() <= set(env), variables() - set(env)
    assert env["ROUTERKT_GATEWAY_DNS"] == f"gateway:{defaults.grpc_port}"
    targets = {(s["source"], s["target"]) for s in router["secrets"] if isinstance(s, dict)}
    cert = env["ROUTERKT_ROUTER_TLS_CERT"]
    assert ("tls_cert", cert.rsplit("/", 1)[1]) in targets and ("tls_key", cert.rsplit("/", 1)[1][:-4] + ".key") in targets
    assert any(v.startswith("./k8s/haproxy.cfg:") for v in router["volumes"])
    assert "50051:50051" in router["ports"] and "50051:50051" not in compose["services"]["gateway"].get("ports", [])
