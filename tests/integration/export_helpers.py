"""Shared by the export tests (tests/integration/test_*_export.py)."""
from __future__ import annotations

from pathlib import Path

import pytest


def assert_a_failed_parity_publishes_nothing(run: Path, repo: Path, monkeypatch, graph: str) -> None:
    """`routerkt export` of `run` into `repo` with export.exporter's check_<graph>_parity failing:
    ExportError "<graph> parity check failed", and no model folder in `repo`."""
    from export import exporter
    from export.onnx_export import ExportError, ParityReport
    monkeypatch.setattr(exporter, f"check_{graph}_parity",
                        lambda *args, **kwargs: ParityReport(max_abs_diff=1e-3, cases=[(1, 19, 1, 1e-3)]))
    with pytest.raises(ExportError, match=f"{graph} parity check failed"):
        exporter.export_run(run, repo, name="kt", log=lambda *_: None)
    assert not (repo / "kt").exists()
