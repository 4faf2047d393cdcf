"""Export: ONNX parity with PyTorch for every preset at several batch sizes and lengths, refusal of
the leaking routing scope, and one-line errors that leave the repository untouched."""
from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from export.onnx_export import ExportError, check_parity, example_inputs, export_onnx
from training.config import RouterScoring, RoutingScope
from training.models.registry import PRESETS, build_model, preset_config, with_vocab

pytestmark = pytest.mark.integration
ROUTERKT = str(Path(sys.executable).parent / "routerkt")


@pytest.mark.parametrize("name", list(PRESETS))
def test_onnx_parity_every_preset(name, tmp_path):
    torch.manual_seed(0)
    cfg = with_vocab(preset_config(name), 60, 14)
    cfg.max_len = 50
    model = build_model(cfg)
    export_onnx(model, tmp_path / "m.onnx")
    real_like = [example_inputs(60, 14, 16, 50, seed=9, min_len=1)]
    report = check_parity(model, tmp_path / "m.onnx", batches=real_like,
                          shapes=((1, 50), (5, 13), (33, 50), (2, 2), (128, 50)))
    assert report.ok, report.cases
    assert len(report.cases) == 6


# router options that are no preset of their own, at tiny widths (fast)
TINY = {"d_model": 32, "n_blocks": 1, "d_ff": 32, "final_fc": 32, "final_fc2": 16, "max_len": 30}
ROUTER_OPTIONS = [
    pytest.param("routerkt-akt", {"person_topk": True}, id="routerkt-akt+person_topk"),
    pytest.param("routerkt-cl4kt-qn", {"person_topk": True}, id="routerkt-cl4kt-qn+person_topk"),
    pytest.param("routerkt-akt", {"router_scoring": RouterScoring.QUERY_NORM}, id="routerkt-akt+query_norm"),
]


@pytest.mark.parametrize(("name", "opts"), ROUTER_OPTIONS)
def test_onnx_parity_router_options(name, opts, tmp_path):
    torch.manual_seed(0)
    cfg = dataclasses.replace(with_vocab(preset_config(name), 60, 14), **TINY, **opts)
    model = build_model(cfg)
    export_onnx(model, tmp_path / "m.onnx")
    real_like = [example_inputs(60, 14, 16, 30, seed=9, min_len=1)]
    report = check_parity(model, tmp_path / "m.onnx", batches=real_like, shapes=((1, 30), (5, 13), (2, 2)))
    assert report.ok, report.cases


def test_sequence_scope_is_refused():
    cfg = with_vocab(preset_config("routerkt-akt"), 30, 10)
    cfg.routing_scope = RoutingScope.SEQUENCE
    with pytest.raises(ExportError, match="sequence"):
        export_onnx(build_model(cfg), Path("/nonexistent/never-written.onnx"))


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*"))} if root.exists() else {}


def _export(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([ROUTERKT, "export", *args], capture_output=True, text=True, timeout=300)


def test_export_errors_leave_repository_untouched(kt_repository, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(kt_repository.path, repo)
    before = _snapshot(repo)
    broken = tmp_path / "broken"
    shutil.copytree(kt_repository.run, broken)
    meta = json.loads((broken / "fold-0" / "meta.json").read_text())
    meta["config"]["model"]["backbone"] = "transformer-xl"               # unknown model in the run
    (broken / "fold-0" / "meta.json").write_text(json.dumps(meta))
    truncated = tmp_path / "truncated"
    shutil.copytree(kt_repository.run, truncated)
    (truncated / "fold-0" / "model.pt").write_bytes(b"\x80\x02")
    a_file = tmp_path / "repo.txt"
    a_file.write_text("not a folder")
    scored = tmp_path / "scored"                     # an older version that serves the score graph
    shutil.copytree(kt_repository.path, scored)
    info = json.loads((scored / "kt" / "1" / "model_info.json").read_text())
    info["served_graph"] = "score"
    (scored / "kt" / "1" / "model_info.json").write_text(json.dumps(info))
    cases = [
        (["--run", str(tmp_path / "missing"), "--repository", str(repo)], "does not exist"),
        (["--run", str(broken), "--repository", str(repo)], "corrupt checkpoint metadata"),
        (["--run", str(truncated), "--repository", str(repo)], "does not match"),
        (["--run", str(kt_repository.run), "--repository", str(a_file)], "is a file"),
        (["--run", str(kt_repository.run), "--repository", str(repo), "--name", "bad/name"], "model name"),
        (["--run", str(kt_repository.run), "--repository", str(repo), "--backend", "tensorrt"], "TensorRT"),
        (["--run", str(kt_repository.run), "--repository", str(scored), "--name", "kt"], "serves the score graph"),
    ]
    for args, message in cases:
        proc = _export(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, proc.stderr)
    assert _snapshot(repo) == before
    assert a_file.read_text() == "not a folder"


def test_export_publishes_new_versions(kt_repository, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(kt_repository.path, repo)
    # step graphs are another test's (test_step_export.py): left out here, they were most of this test's time
    proc = _export("--run", str(kt_repository.run), "--repository", str(repo), "--name", "kt", "--keep-versions", "2",
                   "--no-step-graphs")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["version"] == 2 and out["parity_max_abs_diff"] <= 1e-5
    info = json.loads((repo / "kt" / "2" / "model_info.json").read_text())
    assert info["window"] == 20 and info["provenance"]["run_id"]
    config = (repo / "kt" / "config.pbtxt").read_text()
    assert "KIND_CPU" in config and "all {" in config      # every version folder served
    assert 'key: "valid_auc"' not in config and 'key: "N_QUESTIONS"' not in config   # both in model_info.json
    vocab = json.loads((repo / "kt" / "2" / "vocab.json").read_text())
    assert vocab["format"] == "routerkt-vocab/2" and np.all(np.array(list(vocab["questions"].values())) >= 2)
    # plain graphs by default; --fuse-attention runs the pass on the served graph (routerkt-akt: every core)
    def fused_nodes(version: int) -> list:
        graph = onnx.load(str(repo / "kt" / str(version) / "rank.onnx")).graph
        return [n for n in graph.node if n.op_type == "MultiHeadAttention"]
    assert out["fused_attention_cores"] == 0 and not fused_nodes(2)
    fused = _export("--run", str(kt_repository.run), "--repository", str(repo), "--name", "kt", "--fuse-attention",
                    "--no-step-graphs")
    assert fused.returncode == 0, fused.stderr
    assert json.loads(fused.stdout.strip().splitlines()[-1])["fused_attention_cores"] == len(fused_nodes(3)) > 0
    assert "rank graph: fused attention" in fused.stdout + fused.stderr


def test_gpu_check_script_runs_on_cpu(tmp_path):
    """The GPU host script (export/gpu_check.py) keeps working; on CPU it checks eager parity only."""
    from export import gpu_check
    assert gpu_check.main(["--presets", "routerkt-akt", "--batch", "8", "--seq-len", "12", "--repeats", "1",
                           "--device", "cpu", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "gpu_check.json").read_text())
    assert rows[0]["eager_max_abs_diff_vs_ort_cpu"] < 1e-5 and rows[0]["eager_samples_per_s"] > 0
    assert rows[0]["train_step_max_param_diff_vs_cpu"] < 1e-6          # CPU against itself: the same step


def test_int8_export_stays_within_its_tolerance(kt_repository, tmp_path):
    repo = tmp_path / "repo"
    proc = _export("--run", str(kt_repository.run), "--repository", str(repo), "--name", "kt8", "--quantize", "int8")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["parity_max_abs_diff"] <= 0.02
    info = json.loads((repo / "kt8" / "1" / "model_info.json").read_text())
    assert info["quantization"] == "int8"
    import onnx
    model = onnx.load(str(repo / "kt8" / "1" / "model.onnx"))
    assert any(n.op_type in ("MatMulInteger", "DynamicQuantizeLinear") for n in model.graph.node)
