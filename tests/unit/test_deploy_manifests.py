"""serving/deploy/: the Dockerfiles, Kubernetes manifests, docker-compose.yml and the Prometheus and
Grafana files, checked offline (no Docker, no cluster).

The code is the single source of truth: ports and flags come from serving.settings.Settings and the
real `routerkt serve` argument parser (serving/cli/cli_serve.py), probe and metrics paths from the
gateway's FastAPI routes (serving/transport/http_api.py), Triton's flags from serving/tritonserver/launcher.py. Every
Kubernetes object is validated against the Kubernetes JSON schemas shipped in `kubernetes-validate`
(strict: unknown fields fail); the ServiceMonitor CRD has no schema there and is checked by hand.
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import tomllib
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlparse

import pytest

yaml = pytest.importorskip("yaml", reason="needs PyYAML (dev extra)")
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="needs kubernetes-validate (dev extra)")

from serving.cli import cli_serve  # noqa: E402
from serving.backends.triton.client import TRITON_KEY_HEADER  # noqa: E402
from serving.security.guard import Guard  # noqa: E402
from serving.security.triton_access import RESTRICTED_GROUPS  # noqa: E402
from serving.sessions.redis_store import acl_rules  # noqa: E402
from serving.settings import Settings  # noqa: E402
from serving.tritonserver.install import TritonInstall  # noqa: E402
from serving.tritonserver.launcher import TritonPorts, TritonServer  # noqa: E402

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "serving" / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "docker-compose.yml"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
GRAFANA = DEPLOY / "grafana" / "provisioning"
DASHBOARDS = ROOT / "serving" / "dashboards"

K8S_VERSION = "1.30.0"                    # the oldest Kubernetes the manifests are meant for
CRDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}
# Triton's own defaults (KServe v2 protocol); the gateway's Settings.triton_url must use TRITON_GRPC.
TRITON_HTTP, TRITON_GRPC, TRITON_METRICS = 8000, 8001, 8002
TRITON_READY, TRITON_LIVE = "/v2/health/ready", "/v2/health/live"
# nvidia-pytriton pin -> the NGC release of the same Triton server (0.7.0 bundles Triton 2.51 = 24.10)
PYTRITON_TO_NGC = {"0.7.0": "24.10"}
REDIS_PORT = 6379
BIND_ALL = "0.0.0.0"
# tritonserver flags the deployments set differently from the local launcher (paths, loopback)
LAUNCHER_ONLY = ("--model-repository=", "--backend-directory=", "--cache-directory=", "--http-address=",
                 "--grpc-address=", "--metrics-address=")
# deployments only (the launcher's Triton stays on loopback): model control behind a header key
RESTRICTED = ("--grpc-restricted-protocol=", "--http-restricted-api=")
# deployments only: gRPC over mutual TLS (serve's own Triton is on a private Unix socket instead)
TRITON_TLS = ("--grpc-use-ssl=", "--grpc-use-ssl-mutual=", "--grpc-server-cert=", "--grpc-server-key=",
              "--grpc-root-cert=")


# -- sources of truth ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def defaults() -> Settings:
    return Settings()


@pytest.fixture(scope="module")
def routes() -> dict[str, str]:
    """Route name -> path of the gateway's HTTP app (livez, readyz, prometheus, ...)."""
    from serving.transport.http_api import create_app
    from serving.metrics import Metrics

    stub = SimpleNamespace(service=SimpleNamespace(settings=Settings(), metrics=Metrics()), sessions=None,
                           recommender=None, policy=None, health=None, guard=Guard())
    app = create_app(stub)
    return {route.name: route.path for route in app.routes if hasattr(route, "path")}


def test_code_defaults_are_what_the_deployments_assume(defaults: Settings, routes: dict[str, str]) -> None:
    assert defaults.triton_url.rsplit(":", 1)[1] == str(TRITON_GRPC)
    assert {"livez", "readyz", "prometheus"} <= set(routes)


def serve_args(argv: list[str]) -> argparse.Namespace:
    """`argv` parsed by the real `routerkt serve` parser (an unknown flag or bad value fails)."""
    parser = argparse.ArgumentParser(prog="routerkt serve", exit_on_error=False)
    cli_serve.add_arguments(parser)
    try:
        return parser.parse_args(argv)
    except (SystemExit, argparse.ArgumentError) as exc:
        pytest.fail(f"`routerkt serve` rejects {argv}: {exc}")


def launcher_flags() -> set[str]:
    """The tritonserver flags of serving/tritonserver/launcher.py, less paths and loopback addresses."""
    fake = Path("unused")
    install = TritonInstall(server=fake / "tritonserver", python_backend=fake, stub=fake, libs=fake, caches=fake)
    server = TritonServer("unused", ports=TritonPorts(http=TRITON_HTTP, grpc=TRITON_GRPC, metrics=TRITON_METRICS))
    argv = server.command(install, fake)[1:]
    return {flag for flag in normalized(argv) if not flag.startswith(LAUNCHER_ONLY)}


def normalized(argv: list[str]) -> list[str]:
    """['--a', 'x', '--b=y'] -> ['--a=x', '--b=y']."""
    out: list[str] = []
    for token in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and not token.startswith("--"):
            out[-1] += "=" + token
        else:
            out.append(token)
    return out


def check_triton_argv(argv: list[str], where: str, restricted: bool = True) -> str:
    """argv = ['tritonserver', flags...] with the launcher's flags; returns --model-repository."""
    assert argv[0] == "tritonserver", where
    flags = normalized(argv[1:])
    repository = [f.split("=", 1)[1] for f in flags if f.startswith("--model-repository=")]
    assert len(repository) == 1, f"{where}: one --model-repository"
    assert {f for f in flags if not f.startswith(("--model-repository=", *RESTRICTED, *TRITON_TLS))} == \
        launcher_flags(), where
    for prefix in RESTRICTED if restricted else ():
        (value,) = [f.split("=", 1)[1] for f in flags if f.startswith(prefix)] or [None]
        assert value is not None, f"{where}: {prefix} restricts model control"
        groups, _, header = value.partition(":")
        assert groups == RESTRICTED_GROUPS and header.split("=")[0] == TRITON_KEY_HEADER, where   # as serve's Triton
    return repository[0]


def check_gateway_args(args: argparse.Namespace, defaults: Settings, triton_host: str, redis_host: str,
                       where: str) -> None:
    assert args.host == BIND_ALL, f"{where}: the gateway must bind every address in a container"
    assert args.grpc_port == defaults.grpc_port, where
    assert args.http_port == defaults.http_port, where
    assert args.triton_url == f"{triton_host}:{TRITON_GRPC}", where
    store = urlparse(args.store)
    assert store.scheme in ("redis", "rediss") and (store.hostname, store.port, store.username) == \
        (redis_host, REDIS_PORT, "routerkt"), where
    assert args.store_password_file and args.tls_cert and args.tls_key and args.api_keys, \
        f"{where}: TLS, API keys and the store's password"
    assert args.triton_key_file and not args.insecure, where
    assert args.triton_tls_ca and args.triton_tls_cert and args.triton_tls_key, f"{where}: mutual TLS to Triton"


def triton_tls_files(argv: list[str], where: str) -> dict[str, str]:
    """Triton's gRPC TLS flags in `argv` (mutual TLS on) -> {"cert", "key", "root"}: the files."""
    flags = dict(f.split("=", 1) for f in normalized(argv[1:]) if f.startswith(TRITON_TLS))
    assert flags.get("--grpc-use-ssl") == "true" and flags.get("--grpc-use-ssl-mutual") == "true", \
        f"{where}: Triton's gRPC must speak mutual TLS"
    return {"cert": flags["--grpc-server-cert"], "key": flags["--grpc-server-key"], "root": flags["--grpc-root-cert"]}


# -- YAML ------------------------------------------------------------------------------------------
YAML_FILES = sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


def load_docs(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def test_deploy_folder_has_yaml() -> None:
    names = {p.relative_to(DEPLOY).as_posix() for p in YAML_FILES}
    assert {"docker-compose.yml", "prometheus/prometheus.yml", "k8s/kustomization.yaml"} <= names


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_yaml_parses(path: Path) -> None:
    docs = load_docs(path)
    assert docs, f"{path.name} holds no document"
    assert all(isinstance(doc, dict) for doc in docs), f"{path.name}: every document must be a mapping"


# -- Kubernetes ----------------------------------------------------------------------------------
def k8s_objects() -> list[tuple[Path, dict]]:
    return [(path, doc) for path in YAML_FILES if K8S in path.parents and path.name != "kustomization.yaml"
            for doc in load_docs(path)]


def k8s_id(item: tuple[Path, dict]) -> str:
    return f"{item[0].name}:{item[1].get('kind')}/{item[1].get('metadata', {}).get('name')}"


@pytest.fixture(scope="module")
def objects() -> dict[tuple[str, str], dict]:
    """(kind, name) -> object, for every object of the base (kubectl apply -k serving/deploy/k8s)."""
    table: dict[tuple[str, str], dict] = {}
    for path, doc in k8s_objects():
        key = (doc["kind"], doc["metadata"]["name"])
        assert key not in table, f"{key} defined twice"
        table[key] = doc
    return table


@pytest.mark.parametrize("item", [i for i in k8s_objects() if (i[1].get("apiVersion"), i[1].get("kind")) not in CRDS],
                         ids=k8s_id)
def test_k8s_object_matches_schema(item: tuple[Path, dict]) -> None:
    path, doc = item
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{k8s_id(item)}: {exc.caught.message} at {'/'.join(map(str, exc.caught.path))}")
    except kubernetes_validate.SchemaNotFoundError as exc:
        pytest.fail(f"{k8s_id(item)}: no Kubernetes {K8S_VERSION} schema for it ({exc}); a CRD belongs in CRDS")


def kustomize_resources(folder: Path) -> list[str]:
    (doc,) = load_docs(folder / "kustomization.yaml")
    assert doc["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and doc["kind"] == "Kustomization"
    return doc["resources"]


def test_kustomizations_list_every_manifest() -> None:
    listed: set[Path] = set()
    for kustomization in K8S.rglob("kustomization.yaml"):
        for entry in kustomize_resources(kustomization.parent):
            target = (kustomization.parent / entry).resolve()
            assert target.exists(), f"{kustomization.relative_to(DEPLOY)} lists missing {entry}"
            listed.add(target)
    manifests = {p.resolve() for p, _ in k8s_objects()}
    assert manifests - listed == set(), "manifests no kustomization lists"
    base = {(K8S / entry).resolve() for entry in kustomize_resources(K8S)}
    crd_files = {p.resolve() for p, d in k8s_objects() if (d["apiVersion"], d["kind"]) in CRDS}
    assert not base & crd_files, "the base must apply without the Prometheus Operator's CRDs"
    assert base == manifests - crd_files


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def workloads(objects: dict) -> dict[tuple[str, str], dict]:
    return {key: obj for key, obj in objects.items() if key[0] in ("Deployment", "StatefulSet")}


def selected(objects: dict, selector: dict) -> list[dict]:
    """Workloads whose pod labels match `selector` (a label map)."""
    return [w for w in workloads(objects).values()
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()]


def container_port(workload: dict, port: int | str) -> int:
    """The containerPort a Service/probe port (number or name) means in `workload`."""
    ports = [p for c in pod_spec(workload)["containers"] for p in c.get("ports", [])]
    for entry in ports:
        if port in (entry["containerPort"], entry.get("name")):
            return entry["containerPort"]
    pytest.fail(f"{workload['metadata']['name']} has no container port {port!r} (has {ports})")


def only(workload_objects: dict, component: str) -> dict:
    found = [w for w in workloads(workload_objects).values()
             if w["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == component]
    assert len(found) == 1, f"one {component} workload expected, found {len(found)}"
    return found[0]


def service_for(objects: dict, workload: dict) -> dict:
    found = [obj for (kind, _), obj in objects.items()
             if kind == "Service" and workload in selected(objects, obj["spec"]["selector"])]
    assert len(found) == 1, f"one Service for {workload['metadata']['name']}, found {len(found)}"
    return found[0]


def test_every_workload_selects_its_pods_and_has_resources(objects: dict) -> None:
    assert workloads(objects), "no Deployment/StatefulSet found"
    for (kind, name), workload in workloads(objects).items():
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
        for container in pod_spec(workload)["containers"]:
            resources = container.get("resources", {})
            for part in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(part, {})), f"{name}/{container['name']}: {part}"


def test_services_route_to_container_ports(objects: dict) -> None:
    for (kind, name), service in objects.items():
        if kind != "Service":
            continue
        targets = selected(objects, service["spec"]["selector"])
        assert len(targets) == 1, f"Service {name} selects {len(targets)} workloads"
        for port in service["spec"]["ports"]:
            number = container_port(targets[0], port.get("targetPort", port["port"]))
            assert port["port"] == number, f"Service {name} port {port['name']}: {port['port']} -> {number}"
    for (kind, name), workload in workloads(objects).items():
        if kind == "StatefulSet":
            service = objects.get(("Service", workload["spec"]["serviceName"]))
            assert service is not None and service["spec"].get("clusterIP") == "None", \
                f"StatefulSet {name} needs its headless Service"


def test_pod_disruption_budgets_cover_gateway_and_triton(objects: dict) -> None:
    covered = set()
    for (kind, name), pdb in objects.items():
        if kind == "PodDisruptionBudget":
            targets = selected(objects, pdb["spec"]["selector"]["matchLabels"])
            assert len(targets) == 1, f"PDB {name} selects {len(targets)} workloads"
            assert targets[0]["spec"]["replicas"] > 1, f"PDB {name} on a single replica blocks drains"
            covered.add(targets[0]["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"])
    assert {"gateway", "triton"} <= covered


def test_gateway_hpa_scales_on_cpu(objects: dict) -> None:
    hpas = [obj for (kind, _), obj in objects.items() if kind == "HorizontalPodAutoscaler"]
    assert len(hpas) == 1 and hpas[0]["apiVersion"] == "autoscaling/v2"
    spec = hpas[0]["spec"]
    target = objects.get((spec["scaleTargetRef"]["kind"], spec["scaleTargetRef"]["name"]))
    assert target is only(objects, "gateway"), "the HPA must scale the gateway Deployment"
    assert [m["resource"]["name"] for m in spec["metrics"] if m["type"] == "Resource"] == ["cpu"]
    assert spec["minReplicas"] >= 2 and spec["maxReplicas"] > spec["minReplicas"]
    assert all("cpu" in c["resources"]["requests"] for c in pod_spec(target)["containers"]), \
        "CPU utilisation needs CPU requests"


def probe_target(workload: dict, probe: dict) -> tuple[str, int]:
    return probe["httpGet"]["path"], container_port(workload, probe["httpGet"]["port"])


def scrape_annotations(workload: dict) -> tuple[str, int]:
    notes = workload["spec"]["template"]["metadata"].get("annotations", {})
    assert notes.get("prometheus.io/scrape") == "true", workload["metadata"]["name"]
    return notes["prometheus.io/path"], int(notes["prometheus.io/port"])


def dockerfile_copy_target(dockerfile: Path, source: str) -> str:
    """Where `COPY <source> <dest>` puts `source` in the image."""
    for instruction, rest in dockerfile_instructions(dockerfile):
        parts = rest.split()
        if instruction == "COPY" and not parts[0].startswith("--") and parts[0].rstrip("/") == source:
            return parts[1].rstrip("/")
    pytest.fail(f"{dockerfile.name} does not COPY {source}")


def test_gateway_deployment_matches_code(objects: dict, defaults: Settings, routes: dict[str, str]) -> None:
    gateway = only(objects, "gateway")
    (container,) = pod_spec(gateway)["containers"]
    args = serve_args(container["args"])
    triton = service_for(objects, only(objects, "triton"))["metadata"]["name"]
    redis = service_for(objects, only(objects, "redis"))["metadata"]["name"]
    check_gateway_args(args, defaults, triton, redis, "k8s gateway")
    assert container_port(gateway, "grpc") == defaults.grpc_port
    assert container_port(gateway, "http") == defaults.http_port
    assert probe_target(gateway, container["readinessProbe"]) == (routes["readyz"], defaults.http_port)
    assert probe_target(gateway, container["livenessProbe"]) == (routes["livez"], defaults.http_port)
    assert scrape_annotations(gateway) == (routes["prometheus"], defaults.http_port)
    assert str(args.repository) == dockerfile_copy_target(DEPLOY / "gateway.Dockerfile", "model_repository")
    # the gateway drains for --grace-period before it exits: the pod must wait longer
    assert pod_spec(gateway)["terminationGracePeriodSeconds"] > args.grace_period


def test_gateway_store_secret_comes_from_a_secret_volume(objects: dict) -> None:
    gateway = only(objects, "gateway")
    (container,) = pod_spec(gateway)["containers"]
    secret_file = Path(serve_args(container["args"]).store_secret_file)
    volumes = {v["name"]: v for v in pod_spec(gateway)["volumes"]}
    mounts = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == secret_file.parent]
    assert len(mounts) == 1, "--store-secret-file must lie in a mounted volume"
    secret = volumes[mounts[0]["name"]].get("secret")
    assert secret is not None, "the store secret volume must be a Secret"
    assert secret_file.name in [item["path"] for item in secret["items"]]
    committed = [name for (kind, name), obj in objects.items() if kind == "Secret" and (obj.get("data") or
                                                                                        obj.get("stringData"))]
    assert committed == [], "no secret values in the repository"


def test_triton_deployment_matches_launcher(objects: dict, routes: dict[str, str]) -> None:
    triton = only(objects, "triton")
    (container,) = pod_spec(triton)["containers"]
    repository = check_triton_argv(container["command"] + container["args"], "k8s triton")
    assert repository == dockerfile_copy_target(DEPLOY / "triton.Dockerfile", "model_repository")
    assert {name: container_port(triton, name) for name in ("http", "grpc", "metrics")} == \
        {"http": TRITON_HTTP, "grpc": TRITON_GRPC, "metrics": TRITON_METRICS}
    assert probe_target(triton, container["readinessProbe"]) == (TRITON_READY, TRITON_HTTP)
    assert probe_target(triton, container["livenessProbe"]) == (TRITON_LIVE, TRITON_HTTP)
    assert scrape_annotations(triton) == ("/metrics", TRITON_METRICS)


def test_redis_keeps_its_data_on_a_volume_claim(objects: dict) -> None:
    redis = only(objects, "redis")
    assert redis["kind"] == "StatefulSet"
    (container,) = pod_spec(redis)["containers"]
    flags = normalized(container["command"][1:] + container["args"])
    assert f"--tls-port={REDIS_PORT}" in flags and "--port=0" in flags and "--appendfsync=always" in flags
    assert container_port(redis, "redis") == REDIS_PORT
    claims = {c["metadata"]["name"] for c in redis["spec"]["volumeClaimTemplates"]}
    data_dir = next(f.split("=", 1)[1] for f in flags if f.startswith("--dir="))
    assert any(m["name"] in claims and m["mountPath"] == data_dir for m in container["volumeMounts"])


def test_service_monitors(objects: dict, defaults: Settings, routes: dict[str, str]) -> None:
    monitors = [(path, doc) for path, doc in k8s_objects() if (doc["apiVersion"], doc["kind"]) in CRDS]
    expected = {"gateway": defaults.http_port, "triton": TRITON_METRICS}
    seen = {}
    for path, monitor in monitors:
        assert monitor["metadata"]["name"], path.name
        services = [obj for (kind, _), obj in objects.items() if kind == "Service"
                    and monitor["spec"]["selector"]["matchLabels"].items() <= obj["metadata"]["labels"].items()]
        assert len(services) == 1, f"ServiceMonitor {monitor['metadata']['name']} selects {len(services)} Services"
        ports = {p["name"]: p["port"] for p in services[0]["spec"]["ports"]}
        assert monitor["spec"]["endpoints"], "a ServiceMonitor needs endpoints"
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["port"] in ports, f"ServiceMonitor port {endpoint['port']!r} is no Service port name"
            assert endpoint.get("path", "/metrics") == routes["prometheus"]
            component = services[0]["metadata"]["labels"]["app.kubernetes.io/component"]
            seen[component] = ports[endpoint["port"]]
    assert seen == expected


# -- docker compose ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compose() -> dict:
    (doc,) = load_docs(COMPOSE)
    return doc


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
    from export import cli_retrain
    services = compose["services"]
    parser = argparse.ArgumentParser(prog="routerkt retrain", exit_on_error=False)
    cli_retrain.add_arguments(parser)
    args = parser.parse_args(services["retrain"]["command"][1:])
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


def test_compose_monitoring_is_loopback_only_authenticated_and_verifies_tls(compose: dict) -> None:
    """Prometheus (no authentication of its own) and Grafana publish on the host's loopback only,
    Grafana's admin password has no default, and Prometheus verifies the gateway's certificate."""
    services = compose["services"]
    for name in ("prometheus", "grafana"):
        for published in services[name].get("ports", []):
            assert str(published).startswith("127.0.0.1:"), f"compose {name} publishes {published} beyond loopback"
    env = services["grafana"]["environment"]
    assert re.fullmatch(r"\$\{\w+:\?[^}]+\}", env["GF_SECURITY_ADMIN_PASSWORD"]), "Grafana's password: required, no default"
    assert str(env.get("GF_AUTH_ANONYMOUS_ENABLED", "false")).lower() == "false"
    (config,) = load_docs(PROMETHEUS)
    (gateway_job,) = [job for job in config["scrape_configs"]
                      if any(t.startswith("gateway:") for s in job["static_configs"] for t in s["targets"])]
    tls = gateway_job.get("tls_config", {})
    assert gateway_job.get("scheme") == "https" and not tls.get("insecure_skip_verify")
    secret = tls["ca_file"].removeprefix("/run/secrets/")
    assert secret in services["prometheus"].get("secrets", []) and secret in compose["secrets"]
    assert tls.get("server_name") == "routerkt-gateway"


def test_gateway_service_ports_say_tls_not_cleartext(objects: dict) -> None:
    """The gateway serves TLS on both ports (--tls-cert): its Service must not announce cleartext
    HTTP/2 (kubernetes.io/h2c) nor plain http to meshes and load balancers."""
    gateway = only(objects, "gateway")
    (container,) = pod_spec(gateway)["containers"]
    assert serve_args(container["args"]).tls_cert
    for port in service_for(objects, gateway)["spec"]["ports"]:
        assert port.get("appProtocol") == "https", f"gateway Service port {port['name']}: {port.get('appProtocol')}"


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


# -- Dockerfiles -----------------------------------------------------------------------------------
def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, rest = line.partition(" ")
            out.append((instruction.upper(), rest.strip()))
    return out


def instruction(path: Path, name: str) -> list[str]:
    return [rest for inst, rest in dockerfile_instructions(path) if inst == name]


def exec_form(path: Path, name: str) -> list[str]:
    (value,) = instruction(path, name)[-1:]
    return json.loads(value)


def exposed(path: Path) -> set[int]:
    return {int(p.split("/")[0]) for rest in instruction(path, "EXPOSE") for p in rest.split()}


def ignore_file(dockerfile: Path) -> list[str]:
    path = dockerfile.with_name(dockerfile.name + ".dockerignore")
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def check_copies_are_in_context(dockerfile: Path) -> None:
    """Every COPY source exists in the repository and is re-included by the allow-list ignore file."""
    rules = ignore_file(dockerfile)
    assert rules[0] == "*", f"{dockerfile.name}.dockerignore must be an allow-list"
    allowed = {rule[1:].rstrip("/") for rule in rules if rule.startswith("!")}
    for rest in instruction(dockerfile, "COPY"):
        parts = rest.split()
        if parts[0].startswith("--from="):
            continue
        for source in parts[:-1]:
            assert (ROOT / source).exists(), f"{dockerfile.name}: COPY {source} does not exist"
            assert source.rstrip("/") in allowed, f"{dockerfile.name}: {source} is excluded from the build context"


def extra_requirements(pyproject: dict, extra: str) -> list[str]:
    """The requirements of an extra, self-references (routerkt[a,b]) expanded."""
    name = pyproject["project"]["name"]
    out = []
    for requirement in pyproject["project"]["optional-dependencies"][extra]:
        match = re.fullmatch(rf"{name}\[([^\]]+)\]", requirement)
        if match:
            for sub in match.group(1).split(","):
                out += extra_requirements(pyproject, sub.strip())
        else:
            out.append(requirement)
    return out


def test_gateway_dockerfile(defaults: Settings) -> None:
    dockerfile = DEPLOY / "gateway.Dockerfile"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert all(base.split()[0] == "python:3.11-slim" for base in instruction(dockerfile, "FROM"))
    installs = [rest for rest in instruction(dockerfile, "RUN") if "pip install" in rest]
    extras = re.findall(r"""["']?\.\[([a-z,]+)\]["']?""", " ".join(installs))
    assert extras == ["serve"], "install the project with its serve extra only"
    packages = [re.split(r"[\[<>=!~ ;]", r, maxsplit=1)[0].lower() for r in extra_requirements(pyproject, "serve")]
    assert "torch" not in packages and "onnx" not in packages, "the serve extra must stay torch-free"
    assert exec_form(dockerfile, "ENTRYPOINT") == ["routerkt", "serve"]
    assert pyproject["project"]["scripts"]["routerkt"] == "routerkt.cli:main"
    args = serve_args(exec_form(dockerfile, "CMD"))
    check_gateway_args(args, defaults, "triton", "redis", "gateway.Dockerfile CMD")
    assert exposed(dockerfile) == {defaults.grpc_port, defaults.http_port}
    assert instruction(dockerfile, "USER") and instruction(dockerfile, "USER")[-1] not in ("root", "0")
    check_copies_are_in_context(dockerfile)


def test_triton_dockerfile() -> None:
    dockerfile = DEPLOY / "triton.Dockerfile"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = [r for r in extra_requirements(pyproject, "serve") if r.startswith("nvidia-pytriton==")]
    assert len(pins) == 1, "the serve extra pins nvidia-pytriton"
    release = PYTRITON_TO_NGC.get(pins[0].split("==")[1])
    assert release, f"{pins[0]}: add its NGC release to PYTRITON_TO_NGC and to triton.Dockerfile"
    assert f"ARG TRITON_RELEASE={release}" in [f"ARG {rest}" for rest in instruction(dockerfile, "ARG")]
    assert instruction(dockerfile, "FROM") == ["nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-py3"]
    check_triton_argv(exec_form(dockerfile, "CMD"), "triton.Dockerfile CMD", restricted=False)   # deployments add it
    assert exposed(dockerfile) == {TRITON_HTTP, TRITON_GRPC, TRITON_METRICS}
    pip = " ".join(rest for rest in instruction(dockerfile, "RUN") if "pip install" in rest)
    installed = {token.split("==")[0] for token in shlex.split(pip) if "==" in token}
    assert {"numpy", "onnxruntime"} <= installed, "the python backend's model.py imports numpy and onnxruntime"
    check_copies_are_in_context(dockerfile)


def test_deploy_files_hold_no_machine_paths() -> None:
    for path in DEPLOY.rglob("*"):
        if path.is_file():
            text = path.read_text()
            for marker in ("/work/", "/home/", "/Users/", "/root/"):
                assert marker not in text, f"{path.relative_to(ROOT)} mentions {marker}"


# -- security (docs/security.md) --------------------------------------------------------------------
def ingress_sources(objects: dict, component: str) -> dict[int, list]:
    """port -> the `from` lists of the NetworkPolicy rules admitting traffic to `component`'s pods."""
    target = only(objects, component)
    policies = [obj for (kind, _), obj in objects.items() if kind == "NetworkPolicy"
                and target in selected(objects, obj["spec"]["podSelector"]["matchLabels"])]
    assert policies, f"no NetworkPolicy selects the {component} pods"
    out: dict[int, list] = {}
    for policy in policies:
        assert "Ingress" in policy["spec"]["policyTypes"]
        for rule in policy["spec"].get("ingress", []):
            for port in rule.get("ports", []):
                out.setdefault(container_port(target, port["port"]), []).append(rule.get("from"))
    return out


def test_only_gateway_pods_reach_triton_and_redis(objects: dict) -> None:
    """... and the retrain job's pods reach Valkey (they export the store), nothing else."""
    gateway_labels = only(objects, "gateway")["spec"]["template"]["metadata"]["labels"]
    retrain_labels = retrain_job(objects)["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    for component, open_ports in (("triton", {TRITON_METRICS}), ("redis", set())):
        allowed = [gateway_labels] + ([retrain_labels] if component == "redis" else [])
        for port, sources in ingress_sources(objects, component).items():
            if port in open_ports:
                continue
            for peers in sources:
                assert peers, f"{component} port {port} is open to every pod"
                for peer in peers:
                    assert set(peer) == {"podSelector"} and any(
                        peer["podSelector"]["matchLabels"].items() <= labels.items() for labels in allowed), \
                        (component, port)


def retrain_job(objects: dict) -> dict:
    (job,) = [obj for (kind, _), obj in objects.items() if kind == "CronJob"]
    return job


def test_retrain_cronjob_matches_code_and_shares_the_served_volume(objects: dict) -> None:
    """The CronJob's args parse with the real `routerkt retrain` parser; it reaches the store as the ACL user
    over TLS with the password from a Secret, and writes the repository and the policy file that the gateway
    and Triton read (one volume claim, the same sub-paths)."""
    from export import cli_retrain
    job = retrain_job(objects)
    spec = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["args"][0] == "retrain" and job["spec"]["concurrencyPolicy"] == "Forbid"
    parser = argparse.ArgumentParser(prog="routerkt retrain", exit_on_error=False)
    cli_retrain.add_arguments(parser)
    args = parser.parse_args(container["args"][1:])
    redis = service_for(objects, only(objects, "redis"))["metadata"]["name"]
    store = urlparse(args.store)
    assert (store.scheme, store.hostname, store.port, store.username) == ("rediss", redis, REDIS_PORT, "routerkt")
    assert args.policy_file is None and args.api_key_file is not None   # the policy changes through the gateway
    for path in (args.store_password_file, args.store_ca_file, args.gateway_ca_file, args.api_key_file):
        assert "secret" in {v["name"]: v for v in spec["volumes"]}[
            next(m["name"] for m in container["volumeMounts"] if Path(m["mountPath"]) == Path(path).parent)]

    def on_claim(pod: dict, mounts: list[dict], path: Path) -> tuple[str, str]:
        """(claim, path inside the claim) of a path a container sees."""
        (mount,) = [m for m in mounts if path == Path(m["mountPath"]) or Path(m["mountPath"]) in path.parents]
        volume = {v["name"]: v for v in pod["volumes"]}[mount["name"]]
        inside = Path(mount.get("subPath", "")) / path.relative_to(mount["mountPath"])
        return volume["persistentVolumeClaim"]["claimName"], inside.as_posix()
    gateway_pod = pod_spec(only(objects, "gateway"))
    (gateway,) = gateway_pod["containers"]
    served = serve_args(gateway["args"])
    mounts = container["volumeMounts"]
    assert on_claim(spec, mounts, Path(args.repository)) == on_claim(gateway_pod, gateway["volumeMounts"],
                                                                      Path(served.repository))
    triton_pod = pod_spec(only(objects, "triton"))
    (triton,) = triton_pod["containers"]
    triton_repo = check_triton_argv(triton["command"] + triton["args"], "k8s triton")
    assert on_claim(spec, mounts, Path(args.repository)) == on_claim(triton_pod, triton["volumeMounts"],
                                                                      Path(triton_repo))
    assert args.gateway.startswith("https://" + service_for(objects, only(objects, "gateway"))["metadata"]["name"])


def secret_volume_of(workload: dict, path: str) -> dict:
    """The Secret volume source that holds file `path` in the workload's (only) container."""
    (container,) = pod_spec(workload)["containers"]
    mounts = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == Path(path).parent]
    assert len(mounts) == 1, f"{path} lies in no mounted volume"
    volume = {v["name"]: v for v in pod_spec(workload)["volumes"]}[mounts[0]["name"]]
    assert "secret" in volume, f"{path} must come from a Secret"
    return volume["secret"]


def test_gateway_serves_tls_with_keys_and_reaches_the_store_as_its_acl_user(objects: dict) -> None:
    gateway, triton, redis = only(objects, "gateway"), only(objects, "triton"), only(objects, "redis")
    (container,) = pod_spec(gateway)["containers"]
    args = serve_args(container["args"])
    for path in (args.tls_cert, args.tls_key, args.api_keys, args.store_password_file, args.triton_key_file):
        secret_volume_of(gateway, str(path))
    assert urlparse(args.store).scheme == "rediss"
    assert all(probe["httpGet"]["scheme"] == "HTTPS" for probe in (container["readinessProbe"], container["livenessProbe"]))
    # Triton's restricted protocols name the key the gateway holds (the same Secret)
    (triton_container,) = pod_spec(triton)["containers"]
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in triton_container.get("env", [])}
    key_secret = secret_volume_of(gateway, str(args.triton_key_file))
    assert any(ref["name"] == key_secret["secretName"] and f"$({name})" in " ".join(triton_container["args"])
               for name, ref in env.items())
    # the ACL user: exactly the store's rules, its password from the gateway's Secret, default user off
    (init,) = pod_spec(redis)["initContainers"]
    assert {e["name"]: e["value"] for e in init["env"]}["ACL_RULES"] == acl_rules()
    assert "user default off" in " ".join(init["args"]) and "user routerkt on" in " ".join(init["args"])
    volumes = {v["name"]: v for v in pod_spec(redis)["volumes"]}
    assert any(v.get("secret", {}).get("secretName") == secret_volume_of(gateway, str(args.store_password_file))
               ["secretName"] for v in volumes.values())


def secret_file(workload: dict, path: str) -> tuple[str, str]:
    """(Secret name, key) of the file `path` a workload's container sees."""
    secret = secret_volume_of(workload, path)
    (item,) = [i for i in secret["items"] if i["path"] == Path(path).name]
    return secret["secretName"], item["key"]


def test_gateway_reaches_triton_over_mutual_tls(objects: dict) -> None:
    """Triton's gRPC requires client certificates of the CA that signed the gateway's, the gateway
    verifies Triton against the CA that signed Triton's and presents its certificate: every file
    comes from a mounted Secret, and the CA files are the same Secret key on both sides' terms."""
    gateway, triton = only(objects, "gateway"), only(objects, "triton")
    (container,) = pod_spec(gateway)["containers"]
    args = serve_args(container["args"])
    (triton_container,) = pod_spec(triton)["containers"]
    files = triton_tls_files(triton_container["command"] + triton_container["args"], "k8s triton")
    assert {secret_file(triton, files[name])[1] for name in ("cert", "key", "root")} == {"tls.crt", "tls.key", "ca.crt"}
    assert len({secret_file(triton, files[name])[0] for name in files}) == 1
    assert secret_file(gateway, str(args.triton_tls_ca))[1] == "ca.crt"
    assert [secret_file(gateway, str(p))[1] for p in (args.triton_tls_cert, args.triton_tls_key)] == ["tls.crt", "tls.key"]
    assert secret_file(gateway, str(args.triton_tls_cert))[0] == secret_file(gateway, str(args.triton_tls_key))[0]
    settings = Settings(triton_url=args.triton_url, triton_tls_ca=args.triton_tls_ca,
                        triton_tls_cert=args.triton_tls_cert, triton_tls_key=args.triton_tls_key).validate()
    assert settings.triton_tls_cert is not None


def test_compose_gateway_reaches_triton_over_mutual_tls(compose: dict) -> None:
    services = compose["services"]
    args = serve_args(services["gateway"]["command"])
    files = triton_tls_files(services["triton"]["command"], "compose triton")
    for service, paths in (("triton", files.values()),
                           ("gateway", (args.triton_tls_ca, args.triton_tls_cert, args.triton_tls_key))):
        for path in paths:
            assert Path(path).parent == Path("/run/secrets") and Path(path).name in services[service]["secrets"], \
                f"compose {service}: {path} must be one of its secrets"
    assert Path(files["root"]).name == Path(args.triton_tls_ca).name, "one CA for Triton and the gateway"
    assert set(services["triton"]["secrets"]) <= set(compose["secrets"])


def test_compose_store_user_has_the_store_rules(compose: dict) -> None:
    redis, gateway = compose["services"]["redis"], compose["services"]["gateway"]
    assert acl_rules() in " ".join(redis["entrypoint"]) and "user default off" in " ".join(redis["entrypoint"])
    assert set(redis["secrets"]) <= set(gateway["secrets"]) <= set(compose["secrets"])


def secrets_held(objects: dict) -> dict[str, set[str]]:
    """Secret name -> the components of the workloads that mount it or read it into their environment."""
    held: dict[str, set[str]] = {}
    templates = [w["spec"]["template"] for w in workloads(objects).values()]
    templates += [obj["spec"]["jobTemplate"]["spec"]["template"] for (kind, _), obj in objects.items() if kind == "CronJob"]
    for template in templates:
        component = template["metadata"]["labels"]["app.kubernetes.io/component"]
        spec = template["spec"]
        names = {v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v}
        for container in spec.get("containers", []) + spec.get("initContainers", []):
            names |= {e["valueFrom"]["secretKeyRef"]["name"] for e in container.get("env", [])
                      if "secretKeyRef" in e.get("valueFrom", {})}
            names |= {e["secretRef"]["name"] for e in container.get("envFrom", []) if "secretRef" in e}
        for name in names:
            held.setdefault(name, set()).add(component)
    return held


def test_docs_say_who_holds_which_secret(objects: dict) -> None:
    """docs/security.md's table of Secrets and their holders is what the manifests mount (the
    retrain job holds the store's password: the docs say so)."""
    text = (ROOT / "docs" / "security.md").read_text()
    table = text.split("### Who holds which Secret", 1)[1]
    documented = {}
    for name, holders in re.findall(r"^\| `([a-z0-9-]+)` \| ([^|]+) \|", table, re.M):
        documented[name] = {h.strip().split(" ")[0] for h in holders.split(",")}
    assert documented == secrets_held(objects)
