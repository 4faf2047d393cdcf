"""serving/deploy/'s Dockerfiles, checked offline (no Docker): the gateway image installs the
torch-free serve extra and runs `routerkt serve` with arguments the real parser accepts, the Triton
image is the NGC release of the pinned nvidia-pytriton with the launcher's flags, both copy only what
their allow-list ignore files let in, and no deploy file names a machine's paths."""
from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from serving.settings import Settings
from tests.unit.deploy.manifests import (DEPLOY, ROOT, TRITON_GRPC, TRITON_HTTP, TRITON_METRICS, check_gateway_args,
                                         check_triton_argv, dockerfile_instructions, serve_args)

pytestmark = pytest.mark.unit

# nvidia-pytriton pin -> the NGC release of the same Triton server (0.7.0 bundles Triton 2.51 = 24.10)
PYTRITON_TO_NGC = {"0.7.0": "24.10"}


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
