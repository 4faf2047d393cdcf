"""The gateway never imports torch, directly or indirectly (checked in a fresh interpreter)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
MODULES = ["serving.server", "serving.cli.cli_serve", "serving.cli.cli_predict", "serving.transport.http_api", "serving.pipeline.prediction",
           "serving.transport.grpc_api", "serving.backends.triton.backend", "serving.backends.onnxruntime", "serving.backends.triton.triton_client",
           "serving.backends.triton.supervisor", "serving.core.catalog", "serving.encoder.window", "serving.core.validation",
           "serving.metrics", "serving.settings", "serving.status_errors", "routerkt.contract.repository_reader"]


def test_serving_modules_do_not_import_torch() -> None:
    code = ("import sys\n"
            f"for name in {MODULES!r}:\n"
            "    __import__(name)\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'pandas', 'onnx', 'onnxscript'))\n"
            "print('HEAVY', heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout, out.stdout


def test_routerkt_serve_and_predict_dispatch_without_torch() -> None:
    code = ("import sys\n"
            "from routerkt.cli import build_parser\n"
            "import importlib\n"
            "_, modules = build_parser()\n"
            "for cmd in ('serve', 'predict'):\n"
            "    importlib.import_module(modules[cmd])\n"
            "print('TORCH', 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "TORCH False" in out.stdout
