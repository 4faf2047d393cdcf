"""TensorRT helpers: availability, refusal without TensorRT, trtexec command; a real build on GPUs."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from routerkt.contract import signature
from export.tensorrt import build_engine, tensorrt_available, trtexec_command
from routerkt.errors import UserError

pytestmark = pytest.mark.unit

AVAILABLE, REASON = tensorrt_available()


def test_availability_is_a_flag_and_a_one_line_reason() -> None:
    assert isinstance(AVAILABLE, bool)
    assert REASON and "\n" not in REASON
    if not AVAILABLE:
        assert "TensorRT" in REASON


@pytest.mark.skipif(AVAILABLE, reason="TensorRT is available here; the refusal path cannot run")
def test_build_engine_without_tensorrt_raises_user_error_with_the_reason(tmp_path: Path) -> None:
    plan = tmp_path / signature.PLAN_FILE
    with pytest.raises(UserError) as info:
        build_engine(tmp_path / signature.ONNX_FILE, plan, window=100)
    assert REASON in str(info.value) and "\n" not in str(info.value)
    assert not plan.exists()


@pytest.mark.parametrize("shapes", [(0, 1, 2), (4, 2, 8), (1, 16, 8)])
def test_inconsistent_profile_shapes_are_refused(tmp_path: Path, shapes: tuple[int, int, int]) -> None:
    lo, opt, hi = shapes
    with pytest.raises(UserError, match="min_batch <= opt_batch <= max_batch"):
        build_engine(tmp_path / "m.onnx", tmp_path / "m.plan", 100, min_batch=lo, opt_batch=opt, max_batch=hi)
    with pytest.raises(UserError, match="min_batch <= opt_batch <= max_batch"):
        trtexec_command("m.onnx", "m.plan", 100, min_batch=lo, opt_batch=opt, max_batch=hi)


def test_trtexec_command_covers_every_input_with_the_profile() -> None:
    command = trtexec_command(Path("runs/a b/model.onnx"), Path("out/model.plan"), window=100,
                              min_batch=1, opt_batch=32, max_batch=512, fp16=True, workspace_bytes=2 << 30)
    argv = shlex.split(command)
    assert argv[0] == "trtexec"
    assert "--onnx=runs/a b/model.onnx" in argv and "--saveEngine=out/model.plan" in argv
    for flag, batch in (("--minShapes", 1), ("--optShapes", 32), ("--maxShapes", 512)):
        (value,) = [a.split("=", 1)[1] for a in argv if a.startswith(flag + "=")]
        assert value == ",".join(f"{name}:{batch}x100" for name in signature.SCORE.input_names)
    assert "--memPoolSize=workspace:2048" in argv and "--fp16" in argv
    assert "--fp16" not in shlex.split(trtexec_command("m.onnx", "m.plan", 100))


def _tiny_onnx(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", 100]) for n in signature.SCORE.input_names]
    output = helper.make_tensor_value_info(signature.PROBS, TensorProto.FLOAT, ["batch", 100])
    nodes = [helper.make_node("Sum", list(signature.SCORE.input_names), ["total"]),
             helper.make_node("Cast", ["total"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Sigmoid", ["f"], [signature.PROBS])]
    model = helper.make_model(helper.make_graph(nodes, "tiny", inputs, [output]),
                              opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    onnx.save(model, str(path))


@pytest.mark.tensorrt
@pytest.mark.skipif(not AVAILABLE, reason=f"needs TensorRT and a GPU: {REASON}")
def test_build_a_real_engine(tmp_path: Path) -> None:
    onnx_path, plan = tmp_path / signature.ONNX_FILE, tmp_path / signature.PLAN_FILE
    _tiny_onnx(onnx_path)
    assert build_engine(onnx_path, plan, window=100, min_batch=1, opt_batch=4, max_batch=16) == plan
    assert plan.stat().st_size > 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]     # no temp file left
