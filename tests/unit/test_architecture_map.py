"""The maps stay true: every module of the six packages is named in docs/architecture.md (its file
name and each folder above it), and every package's first docstring names each of its folders."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("routerkt", "training", "export", "serving", "loop", "loadtest")
GENERATED = ("_pb2.py", "_pb2_grpc.py")


def modules() -> list[Path]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name != "__init__.py" and not path.name.endswith(GENERATED) and "__pycache__" not in path.parts:
                found.append(path.relative_to(ROOT))
    return found


def test_every_module_is_named_in_the_architecture_map() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert len(modules()) > 200                                      # the walk found the packages
    missing = [str(path) for path in modules()
               if path.name not in text or any(f"{folder}/" not in text for folder in path.parts[:-1])]
    assert not missing, f"not in docs/architecture.md's map: {missing}"


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_map_names_its_folders(package: str) -> None:
    init = ROOT / package / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
    folders = sorted(p.name for p in (ROOT / package).iterdir()
                     if p.is_dir() and p.name != "__pycache__" and not p.name.startswith("."))
    missing = [name for name in folders if f"{name}/" not in doc]
    assert not missing, f"{init.relative_to(ROOT)}'s docstring does not name {missing}"
