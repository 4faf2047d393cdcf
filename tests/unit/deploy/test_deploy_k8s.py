"""serving/deploy/ YAML and Kubernetes manifests, checked offline (no cluster): every YAML file
parses, every Kubernetes object is validated against the Kubernetes JSON schemas shipped in
`kubernetes-validate` (strict: unknown fields fail; the ServiceMonitor CRD has no schema there and is
checked by hand), the kustomizations list every manifest, and the workloads, Services, probes and
scrape annotations agree with the code: ports and flags from serving.settings.Settings and the real
`routerkt serve` parser, probe and metrics paths from the gateway's FastAPI routes, Triton's flags
from serving/tritonserver/command.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from serving.settings import Settings
from tests.unit.deploy.manifests import (DEPLOY, K8S, REDIS_PORT, TRITON_GRPC, TRITON_HTTP, TRITON_LIVE,
                                         TRITON_METRICS, TRITON_READY, YAML_FILES, check_gateway_args,
                                         check_triton_argv, container_port, dockerfile_copy_target, k8s_objects,
                                         load_docs, normalized, only, pod_spec, selected, serve_args, service_for,
                                         workloads)

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="needs kubernetes-validate (dev extra)")

pytestmark = pytest.mark.unit

K8S_VERSION = "1.30.0"                    # the oldest Kubernetes the manifests are meant for
CRDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}


def test_code_defaults_are_what_the_deployments_assume(defaults: Settings, routes: dict[str, str]) -> None:
    assert defaults.triton_url.rsplit(":", 1)[1] == str(TRITON_GRPC)
    assert {"livez", "readyz", "prometheus"} <= set(routes)


# -- YAML ------------------------------------------------------------------------------------------
def test_deploy_folder_has_yaml() -> None:
    names = {p.relative_to(DEPLOY).as_posix() for p in YAML_FILES}
    assert {"docker-compose.yml", "prometheus/prometheus.yml", "k8s/kustomization.yaml"} <= names


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_yaml_parses(path: Path) -> None:
    docs = load_docs(path)
    assert docs, f"{path.name} holds no document"
    assert all(isinstance(doc, dict) for doc in docs), f"{path.name}: every document must be a mapping"


# -- Kubernetes ----------------------------------------------------------------------------------
def k8s_id(item: tuple[Path, dict]) -> str:
    return f"{item[0].name}:{item[1].get('kind')}/{item[1].get('metadata', {}).get('name')}"


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
