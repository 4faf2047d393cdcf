"""The serving pipeline's interfaces are whole and used as such: every implementation of
InferenceBackend and SessionStore (and the complete unit fake) has each member its Protocol declares,
serving/ probes no part with hasattr for an optional method, and no module of serving/ reaches into
another object's private members (docs/architecture.md, "The serving pipeline")."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from serving.backends.onnxruntime import OnnxRuntimeBackend
from serving.backends.triton.backend import TritonInferenceBackend
from serving.backends.triton.replica_set import TritonReplicaBackend
from serving.pipeline.parts import InferenceBackend
from serving.sessions.redis_store import RedisStore
from serving.sessions.sqlite_store import SqliteStore
from serving.sessions.store import SessionStore
from tests.unit.test_triton_replicas import FakeReplica

pytestmark = pytest.mark.unit

SERVING = Path(__file__).resolve().parents[2] / "serving"
GENERATED = SERVING / "api"                      # protoc's output (codegen.py), not ours to shape


def declared(protocol: type) -> set[str]:
    """The public members a Protocol declares: its methods and properties, and its annotated attributes."""
    return ({name for name in vars(protocol) if not name.startswith("_")}
            | {name for name in getattr(protocol, "__annotations__", {}) if not name.startswith("_")})


@pytest.mark.parametrize("protocol, implementation", [
    (InferenceBackend, OnnxRuntimeBackend), (InferenceBackend, TritonInferenceBackend),
    (InferenceBackend, TritonReplicaBackend), (InferenceBackend, FakeReplica),
    (SessionStore, SqliteStore), (SessionStore, RedisStore)])
def test_every_implementation_has_every_member_of_its_interface(protocol: type, implementation: type) -> None:
    assert {"infer_outputs", "expire", "sweep_served"} & declared(protocol)
    missing = sorted(name for name in declared(protocol) if not hasattr(implementation, name))
    assert not missing, f"{implementation.__name__} lacks {missing} of {protocol.__name__}"


def serving_modules() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(), str(path))) for path in sorted(SERVING.rglob("*.py"))
            if GENERATED not in path.parents]


def test_serving_uses_no_private_member_of_another_object_or_module() -> None:
    found = []
    for path, tree in serving_modules():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                found.append(f"{path.relative_to(SERVING.parent)}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("serving"):
                found += [f"{path.relative_to(SERVING.parent)}:{node.lineno} import {alias.name}"
                          for alias in node.names if alias.name.startswith("_")]
    assert not found, "private members used across objects (make the step public instead):\n" + "\n".join(found)


def test_serving_probes_no_part_for_an_optional_method() -> None:
    found = [f"{path.relative_to(SERVING.parent)}:{node.lineno}" for path, tree in serving_modules()
             for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hasattr"]
    assert not found, "hasattr probes (put the method on the interface instead): " + ", ".join(found)
