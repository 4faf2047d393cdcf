"""Shared by the tests of serving/deploy/ (tests/unit/deploy/): the paths, the ports and flags the
deployments must agree on, the loaders of the YAML files and Dockerfiles, and the checks that parse
the deployments' command lines with the real `routerkt serve` / `routerkt retrain` parsers and
compare Triton's with serving/tritonserver/command.py (through TritonServer.command)."""
from __future__ import annotations

import argparse
import re
from pathlib import Path
from urllib.parse import urlparse

import pytest

yaml = pytest.importorskip("yaml", reason="needs PyYAML (dev extra)")

from serving.backends.triton.triton_client import TRITON_KEY_HEADER  # noqa: E402
from serving.cli import cli_serve  # noqa: E402
from serving.security.triton_access import RESTRICTED_GROUPS  # noqa: E402
from serving.settings import Settings  # noqa: E402
from serving.tritonserver.install import TritonInstall  # noqa: E402
from serving.tritonserver.launcher import TritonPorts, TritonServer  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "serving" / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "docker-compose.yml"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
GRAFANA = DEPLOY / "grafana" / "provisioning"
DASHBOARDS = ROOT / "serving" / "dashboards"

# Triton's own defaults (KServe v2 protocol); the gateway's Settings.triton_url must use TRITON_GRPC.
TRITON_HTTP, TRITON_GRPC, TRITON_METRICS = 8000, 8001, 8002
TRITON_READY, TRITON_LIVE = "/v2/health/ready", "/v2/health/live"
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


# -- command lines ---------------------------------------------------------------------------------
def serve_args(argv: list[str]) -> argparse.Namespace:
    """`argv` parsed by the real `routerkt serve` parser (an unknown flag or bad value fails)."""
    return parsed("serve", cli_serve.add_arguments, argv)


def retrain_args(argv: list[str]) -> argparse.Namespace:
    """`argv` parsed by the real `routerkt retrain` parser (an unknown flag or bad value fails)."""
    from loop import cli_retrain
    return parsed("retrain", cli_retrain.add_arguments, argv)


def parsed(command: str, add_arguments, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"routerkt {command}", exit_on_error=False)
    add_arguments(parser)
    try:
        return parser.parse_args(argv)
    except (SystemExit, argparse.ArgumentError) as exc:
        pytest.fail(f"`routerkt {command}` rejects {argv}: {exc}")


def launcher_flags() -> set[str]:
    """The tritonserver flags serving/tritonserver/command.py builds, less paths and loopback addresses."""
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


# -- YAML and Kubernetes objects -------------------------------------------------------------------
YAML_FILES = sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


def load_docs(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def k8s_objects() -> list[tuple[Path, dict]]:
    return [(path, doc) for path in YAML_FILES if K8S in path.parents and path.name != "kustomization.yaml"
            for doc in load_docs(path)]


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
    """The Service clients reach `workload` through: its only one, or its one with a cluster IP (the gateway's
    headless Service only lists its pods for the learner router)."""
    found = [obj for (kind, _), obj in objects.items()
             if kind == "Service" and workload in selected(objects, obj["spec"]["selector"])]
    if len(found) > 1:
        found = [obj for obj in found if obj["spec"].get("clusterIP") != "None"]
    assert len(found) == 1, f"one Service for {workload['metadata']['name']}, found {len(found)}"
    return found[0]


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


def dockerfile_copy_target(dockerfile: Path, source: str) -> str:
    """Where `COPY <source> <dest>` puts `source` in the image."""
    for instruction, rest in dockerfile_instructions(dockerfile):
        parts = rest.split()
        if instruction == "COPY" and not parts[0].startswith("--") and parts[0].rstrip("/") == source:
            return parts[1].rstrip("/")
    pytest.fail(f"{dockerfile.name} does not COPY {source}")
