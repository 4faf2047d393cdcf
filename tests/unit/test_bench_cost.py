"""`routerkt bench cost` without servers: the per-setting repository copy rewrites exactly the two
swept values of a generated config.pbtxt, bad sweep flags are one-line errors, and the closed-loop
phase counts failures by name."""
from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from export.triton_config import PARAM_N_QUESTIONS, PARAM_N_SKILLS, TritonModelOptions, render_config
from loadtest.bench.cost import _ints, setting_repository
from loadtest.closed_loop import run_phase, summary
from routerkt.contract import signature
from routerkt.errors import UserError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("exported_delay_us", [0, 500])     # 0, the default, is absent from the text
def test_setting_repository_rewrites_delay_and_threads(tmp_path, exported_delay_us):
    source = tmp_path / "repo"
    (source / "kt" / "1").mkdir(parents=True)
    (source / "kt" / "1" / "rank.onnx").write_bytes(b"graph")
    options = TritonModelOptions(window=20, graph=signature.RANK.name, max_queue_delay_us=exported_delay_us,
                                 parameters={PARAM_N_QUESTIONS: "30", PARAM_N_SKILLS: "10"})
    rendered = render_config("kt", options)
    (source / "kt" / "config.pbtxt").write_text(rendered)
    repo = setting_repository(source, "kt", tmp_path / "out", delay_us=123, threads=3)
    text = (repo / "kt" / "config.pbtxt").read_text()
    config = text_format.Parse(text, mc.ModelConfig())
    assert config.dynamic_batching.max_queue_delay_microseconds == 123
    assert config.parameters["ORT_INTRA_OP_THREADS"].string_value == "3"
    assert (repo / "kt" / "1" / "rank.onnx").read_bytes() == b"graph"
    assert (source / "kt" / "config.pbtxt").read_text() == rendered        # the source is untouched


def test_setting_repository_refuses_a_config_without_the_fields(tmp_path):
    (tmp_path / "repo" / "kt").mkdir(parents=True)
    (tmp_path / "repo" / "kt" / "config.pbtxt").write_text('name: "kt"\n')
    with pytest.raises(UserError, match="re-export"):
        setting_repository(tmp_path / "repo", "kt", tmp_path / "out", delay_us=0, threads=1)


@pytest.mark.parametrize(("text", "low"), [("", 0), ("a,1", 0), ("0,1", 1), ("-1", 0)])
def test_sweep_flags_are_checked(text, low):
    with pytest.raises(UserError, match="--flag"):
        _ints(text, "--flag", low)


def test_closed_loop_counts_calls_and_failures():
    import itertools
    calls = itertools.count()

    def call():
        if next(calls) % 2:
            raise TimeoutError
    latencies, failures, wall = run_phase(call, callers=2, seconds=0.05)
    assert latencies and failures and set(failures) == {"TimeoutError"}
    result = summary(latencies, failures, wall)
    assert result["calls"] == len(latencies) and result["failures"] == len(failures)
    assert result["p50_ms"] is not None and result["calls_per_s"] > 0
