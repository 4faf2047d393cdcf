"""serving/deploy/docker-compose.yml, checked offline (no Docker): its references exist, the
gateway's command parses with the real `routerkt serve` parser and agrees with the code, retrain
publishes where Triton and the gateway read, Triton's flags are the launcher's, and Prometheus and
Grafana scrape and show the project's metrics and dashboard."""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

import pytest

from serving.settings import Settings
from tests.unit.deploy.manifests import (COMPOSE, DASHBOARDS, DEPLOY, GRAFANA, PROMETHEUS, REDIS_PORT, TRITON_GRPC,
                                         TRITON_HTTP, TRITON_METRICS, TRITON_READY, check_gateway_args,
                                         check_triton_argv, dockerfile_copy_target, load_docs, normalized,
                                         retrain_args, serve_args)

pytestmark = pytest.mark.unit


def compose_path(text: str) -> Path:
    return (COMPOSE.parent / text).resolve()


def volume_source(entry: str | dict) -> tuple[str, str]:
    if isinstance(entry, dict):
        return entry["source"], entry["target"]
    source, target = entry.split(":")[:2]
    return source, target


def test_compose_references_exist(compose: dict) -> None:
    services = compose["services"]
    assert {"triton", "redis", "gateway", "prometheus", "grafana"} <= set(services)
    named = set(compose.get("volumes") or {})
    for name, service in services.items():
        build = service.get("build")
        if build:
            context = compose_path(build["context"])
            assert context.is_dir(), f"{name}: build context {build['context']}"
            assert (context / build["dockerfile"]).is_file(), f"{name}: dockerfile {build['dockerfile']}"
        for entry in service.get("volumes", []):
            source, _ = volume_source(entry)
            if source.startswith((".", "/")):
                assert not source.startswith("/"), f"{name}: no absolute host paths ({source})"
                assert compose_path(source).exists(), f"{name}: volume source {source} is missing"
            else:
                assert source in named, f"{name}: named volume {source} is not declared"
        depends = service.get("depends_on", [])
        assert set(depends) <= set(services), f"{name}: depends on unknown services"
        assert "image" in service, f"{name}: name the image"


def compose_container_ports(service: dict) -> set[int]:
    published = {int(str(p).rsplit(":", 1)[-1]) for p in service.get("ports", [])}
    return published | {int(p) for p in service.get("expose", [])}


def healthcheck_url(service: dict) -> tuple[str, int]:
    test = " ".join(service["healthcheck"]["test"])
    url = urlparse(re.search(r"https?://[^'\" ]+", test).group(0))
    return url.path, url.port


def test_compose_gateway_matches_code(compose: dict, defaults: Settings, routes: dict[str, str]) -> None:
    gateway = compose["services"]["gateway"]
    args = serve_args(gateway["command"])
    check_gateway_args(args, defaults, "triton", "redis", "compose gateway")
    assert compose_container_ports(gateway) == {defaults.grpc_port, defaults.http_port}
    assert healthcheck_url(gateway) == (routes["readyz"], defaults.http_port)
    assert str(args.repository) == dockerfile_copy_target(DEPLOY / "gateway.Dockerfile", "model_repository")
    secret = gateway["environment"]["ROUTERKT_STORE_SECRET"]
    assert secret.startswith("${ROUTERKT_STORE_SECRET:?"), "the store secret must come from the caller, not the file"


def test_compose_retrain_publishes_where_triton_and_the_gateway_read(compose: dict) -> None:
    """The retrain service's repository and policy file are the gateway's and Triton's, on one volume."""
    services = compose["services"]
    args = retrain_args(services["retrain"]["command"][1:])
    served = serve_args(services["gateway"]["command"])

    def on_volume(service: dict, path: Path) -> tuple[str, str]:
        for entry in service["volumes"]:
            source, target = volume_source(entry)
            if path == Path(target) or Path(target) in path.parents:
                sub = entry.get("volume", {}).get("subpath", "") if isinstance(entry, dict) else ""
                return source, (Path(sub) / path.relative_to(target)).as_posix()
        pytest.fail(f"{path} lies on no volume")
    triton_repo = check_triton_argv(services["triton"]["command"], "compose triton")
    assert on_volume(services["retrain"], Path(args.repository)) == on_volume(services["gateway"], Path(served.repository))
    assert on_volume(services["retrain"], Path(args.repository)) == on_volume(services["triton"], Path(triton_repo))
    assert on_volume(services["retrain"], Path(args.policy_file)) == \
        on_volume(services["gateway"], Path(served.rollout_policy))


def test_compose_triton_and_redis(compose: dict) -> None:
    triton = compose["services"]["triton"]
    repository = check_triton_argv(triton["command"], "compose triton")
    assert repository == dockerfile_copy_target(DEPLOY / "triton.Dockerfile", "model_repository")
    assert compose_container_ports(triton) == {TRITON_HTTP, TRITON_GRPC, TRITON_METRICS}
    assert healthcheck_url(triton) == (TRITON_READY, TRITON_HTTP)
    redis = compose["services"]["redis"]
    assert f"--port={REDIS_PORT}" in normalized(redis["command"][1:])
    assert compose_container_ports(redis) == {REDIS_PORT}


def test_prometheus_scrapes_gateway_and_triton(compose: dict, defaults: Settings, routes: dict[str, str]) -> None:
    mounted = [compose_path(s) for s, t in map(volume_source, compose["services"]["prometheus"]["volumes"])
               if t == "/etc/prometheus/prometheus.yml"]
    assert mounted == [PROMETHEUS.resolve()]
    (config,) = load_docs(PROMETHEUS)
    targets = {}
    for job in config["scrape_configs"]:
        for static in job["static_configs"]:
            for target in static["targets"]:
                host, port = target.rsplit(":", 1)
                assert host in compose["services"], f"scrape target {target}: no such compose service"
                targets[host] = (job.get("metrics_path", "/metrics"), int(port))
    assert targets == {"gateway": (routes["prometheus"], defaults.http_port), "triton": ("/metrics", TRITON_METRICS)}


def test_grafana_provisions_the_project_dashboard(compose: dict) -> None:
    grafana = compose["services"]["grafana"]
    mounts = {t: compose_path(s) for s, t in map(volume_source, grafana["volumes"]) if s.startswith(".")}
    assert mounts.get("/etc/grafana/provisioning") == GRAFANA.resolve()
    (provider_file,) = (GRAFANA / "dashboards").glob("*.y*ml")
    (providers,) = load_docs(provider_file)
    paths = [p["options"]["path"] for p in providers["providers"]]
    assert len(paths) == 1 and mounts.get(paths[0]) == DASHBOARDS.resolve(), \
        "the provider must read the folder mounted from serving/dashboards/"
    assert list(DASHBOARDS.glob("*.json")), "serving/dashboards/ holds no dashboard"
    (datasource_file,) = (GRAFANA / "datasources").glob("*.y*ml")
    (datasources,) = load_docs(datasource_file)
    (source,) = datasources["datasources"]
    url = urlparse(source["url"])
    assert source["type"] == "prometheus" and url.hostname == "prometheus"
    assert url.port in compose_container_ports(compose["services"]["prometheus"])
