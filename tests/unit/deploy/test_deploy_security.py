"""serving/deploy/ against docs/security.md, checked offline: NetworkPolicies let only the
gateway's (and the retrain job's) pods reach Triton and the store, the gateway serves TLS with API
keys and reaches the store as its ACL user and Triton over mutual TLS, every secret file comes from
a mounted Secret, compose's monitoring stays on loopback behind a password, and the docs' table of
who holds which Secret is what the manifests mount."""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

import pytest

from serving.sessions.redis_store import acl_rules
from serving.settings import Settings
from tests.unit.deploy.manifests import (PROMETHEUS, REDIS_PORT, ROOT, TRITON_METRICS, check_triton_argv,
                                         container_port, load_docs, only, pod_spec, retrain_args,
                                         selected, serve_args, service_for, triton_tls_files, workloads)

pytestmark = pytest.mark.unit


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
    job = retrain_job(objects)
    spec = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["args"][0] == "retrain" and job["spec"]["concurrencyPolicy"] == "Forbid"
    args = retrain_args(container["args"][1:])
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
