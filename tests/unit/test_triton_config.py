"""config.pbtxt rendering: every backend renders, parses back, and carries the signature; the version
policy serves every version folder, and `publish_config` keeps a served config whenever it can."""
from __future__ import annotations

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from routerkt.contract import signature
from export.triton_config import (
    HEADER, PARAM_N_QUESTIONS, PARAM_N_SKILLS, PARAM_ORT_INTRA_OP_THREADS, PARAM_WINDOW, WARMUP_NAME,
    Backend, TritonModelOptions, build_config, publish_config, render_config, same_config,
)
from routerkt.contract.repository_reader import parse_triton_config as parse_config
from routerkt.errors import UserError

pytestmark = pytest.mark.unit

VOCAB = {PARAM_N_QUESTIONS: "4001", PARAM_N_SKILLS: "120"}
PROVENANCE = {"run_id": "run-7", "git_sha": "abc123", "valid_auc": "0.7812", "preset": "routerkt-akt"}


def _options(**kwargs) -> TritonModelOptions:
    kwargs.setdefault("parameters", {**VOCAB, **PROVENANCE})
    return TritonModelOptions(**kwargs)


def _round_trip(name: str, options: TritonModelOptions) -> mc.ModelConfig:
    text = render_config(name, options)
    config = parse_config(text)
    assert config == build_config(name, options)
    return config


def _assert_signature(config: mc.ModelConfig, window: int) -> None:
    assert [(t.name, mc.DataType.Name(t.data_type), list(t.dims)) for t in config.input] == [
        (s.name, s.triton_dtype, [window, -1] if signature.skill_axis(s) else [window]) for s in signature.SCORE.inputs]
    assert [(t.name, mc.DataType.Name(t.data_type), list(t.dims)) for t in config.output] == [
        (s.name, s.triton_dtype, [window]) for s in signature.SCORE.outputs]
    assert [t.name for t in config.input] == ["questions", "skills", "responses"]
    assert mc.DataType.Name(config.output[0].data_type) == "TYPE_FP32"


def _assert_batching_without_queue_policy(config: mc.ModelConfig, options: TritonModelOptions) -> None:
    batching = config.dynamic_batching
    assert config.HasField("dynamic_batching")
    assert list(batching.preferred_batch_size) == sorted(options.preferred_batch_sizes)
    assert batching.max_queue_delay_microseconds == options.max_queue_delay_us
    assert not batching.HasField("default_queue_policy")
    assert batching.priority_levels == 0
    assert len(batching.priority_queue_policy) == 0


@pytest.mark.parametrize("backend", list(Backend))
def test_every_backend_round_trips_with_signature_and_batching(backend: Backend) -> None:
    options = _options(backend=backend, window=64, max_batch_size=256, preferred_batch_sizes=[32, 8],
                       max_queue_delay_us=1500, instance_count=2)
    config = _round_trip("routerkt-akt", options)
    assert config.name == "routerkt-akt"
    assert config.max_batch_size == 256
    assert config.version_policy.WhichOneof("policy_choice") == "all"      # every version folder is served
    _assert_signature(config, window=64)
    _assert_batching_without_queue_policy(config, options)
    assert [g.count for g in config.instance_group] == [2]
    for key, value in {**VOCAB, **PROVENANCE}.items():
        assert config.parameters[key].string_value == value


def test_python_backend_runs_on_cpu_with_ort_parameters() -> None:
    config = _round_trip("kt", _options(window=100, ort_intra_op_threads=3))
    assert config.backend == "python"
    assert config.platform == ""
    assert [mc.ModelInstanceGroup.Kind.Name(g.kind) for g in config.instance_group] == ["KIND_CPU"]
    assert config.parameters[PARAM_ORT_INTRA_OP_THREADS].string_value == "3"
    assert config.parameters[PARAM_WINDOW].string_value == "100"
    assert not config.HasField("optimization")


def test_defaults_match_the_measured_setup() -> None:
    options = _options()
    config = _round_trip("kt", options)
    assert config.max_batch_size == 1024
    assert list(config.input[0].dims) == [100]
    assert config.parameters[PARAM_ORT_INTRA_OP_THREADS].string_value == "1"      # `routerkt bench cost`
    assert config.instance_group[0].count == 1
    assert config.version_policy.HasField("all")
    assert config.dynamic_batching.max_queue_delay_microseconds == 0              # `routerkt bench ceiling`


def test_warmup_is_one_zero_filled_batch_of_every_input() -> None:
    config = _round_trip("kt", _options(window=30))
    assert len(config.model_warmup) == 1
    warmup = config.model_warmup[0]
    assert (warmup.name, warmup.batch_size, warmup.count) == (WARMUP_NAME, 1, 1)
    assert sorted(warmup.inputs) == sorted(signature.SCORE.input_names)
    for spec in signature.SCORE.inputs:
        entry = warmup.inputs[spec.name]
        assert entry.zero_data and list(entry.dims) == ([30, 1] if signature.skill_axis(spec) else [30])
        assert mc.DataType.Name(entry.data_type) == spec.triton_dtype
    assert len(_round_trip("kt", _options(warmup=False)).model_warmup) == 0


@pytest.mark.parametrize("fp16, precision", [(True, "FP16"), (False, "FP32")])
def test_onnxruntime_backend_targets_gpu_with_tensorrt_accelerator(fp16: bool, precision: str) -> None:
    config = _round_trip("kt", _options(backend=Backend.ONNXRUNTIME, fp16=fp16, trt_max_workspace_bytes=1 << 28))
    assert (config.platform, config.backend) == ("onnxruntime_onnx", "onnxruntime")
    assert config.default_model_filename == signature.ONNX_FILE
    assert [mc.ModelInstanceGroup.Kind.Name(g.kind) for g in config.instance_group] == ["KIND_GPU"]
    accelerators = config.optimization.execution_accelerators.gpu_execution_accelerator
    assert [a.name for a in accelerators] == ["tensorrt"]
    assert accelerators[0].parameters["precision_mode"] == precision
    assert accelerators[0].parameters["max_workspace_size_bytes"] == str(1 << 28)
    assert config.parameters["intra_op_thread_count"].string_value == str(TritonModelOptions().ort_intra_op_threads)


def test_tensorrt_backend_serves_a_plan_on_gpu() -> None:
    config = _round_trip("kt", _options(backend="tensorrt"))
    assert config.platform == "tensorrt_plan"
    assert config.default_model_filename == signature.PLAN_FILE
    assert [mc.ModelInstanceGroup.Kind.Name(g.kind) for g in config.instance_group] == ["KIND_GPU"]
    assert not config.optimization.execution_accelerators.gpu_execution_accelerator


def test_rendered_text_explains_the_missing_queue_policy_only_in_comments() -> None:
    text = render_config("kt", _options())
    assert text.startswith(HEADER)
    body = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert not any("queue_policy" in line or "priority" in line for line in body)
    assert "default_queue_policy" in HEADER and "priority_levels" in HEADER


def test_rendered_text_names_where_its_runtime_settings_come_from() -> None:
    measured = render_config("kt", _options())
    assert "max_queue_delay_microseconds 0, ORT_INTRA_OP_THREADS 1, instance count 1" in measured
    assert "chosen by `routerkt bench cost` and `routerkt bench ceiling` under 1, 8 and 32 callers" in measured
    changed = render_config("kt", _options(max_queue_delay_us=500, instance_count=2))
    assert "max_queue_delay_microseconds 500, ORT_INTRA_OP_THREADS 1, instance count 2" in changed
    assert "set at export; the measured defaults are 0 us" in changed


@pytest.mark.parametrize("kwargs, message", [
    ({"preferred_batch_sizes": [8, 2048]}, "preferred batch size 2048"),
    ({"max_batch_size": 0}, "max_batch_size"),
    ({"window": -1}, "window"),
    ({"max_queue_delay_us": -5}, "max_queue_delay_us"),
    ({"parameters": {PARAM_N_SKILLS: "0"}}, PARAM_N_SKILLS),
    ({"parameters": {PARAM_N_QUESTIONS: "many"}}, PARAM_N_QUESTIONS),
    ({"parameters": {**VOCAB, PARAM_WINDOW: "50"}}, "conflicts"),
    ({"parameters": {**VOCAB, "bad key": "1"}}, "bad key"),
])
def test_bad_options_raise_user_error_naming_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        render_config("kt", _options(**kwargs))


def test_unknown_backend_and_bad_model_name_are_user_errors() -> None:
    with pytest.raises(UserError, match="unknown Triton backend"):
        TritonModelOptions(backend="openvino")
    with pytest.raises(UserError, match="model name"):
        render_config("../escape", _options())


def test_vocabulary_sizes_are_optional_for_gpu_backends() -> None:
    config = _round_trip("kt", TritonModelOptions(backend=Backend.TENSORRT))
    assert PARAM_N_QUESTIONS not in config.parameters


def test_parse_config_reports_malformed_text() -> None:
    with pytest.raises(UserError, match="invalid config.pbtxt"):
        parse_config('name: "kt"\nmax_batch_size: "many"\n')


def test_the_python_backend_needs_no_vocabulary_sizes() -> None:
    """model.py reads its id bounds from the version's model_info.json: the config carries none."""
    config = _round_trip("kt", TritonModelOptions(window=20, graph=signature.RANK.name))
    assert PARAM_N_QUESTIONS not in config.parameters and PARAM_N_SKILLS not in config.parameters
    assert config.backend == "python"


# -- publish_config: which config.pbtxt a new version of a served model is published with ------------
def _generated(**kwargs) -> str:
    return render_config("kt", TritonModelOptions(window=20, graph=signature.RANK.name, **kwargs))


def _legacy(n_questions: str = "4001", n_skills: str = "120") -> str:
    """A config as exports wrote it before: the newest 2 versions, vocabulary sizes, provenance."""
    config = parse_config(_generated())
    config.version_policy.latest.num_versions = 2
    for key, value in {PARAM_N_QUESTIONS: n_questions, PARAM_N_SKILLS: n_skills, **PROVENANCE}.items():
        config.parameters[key].string_value = value
    from google.protobuf import text_format
    return HEADER + text_format.MessageToString(config)


def test_an_unchanged_config_is_kept_byte_for_byte() -> None:
    served = _generated()
    assert publish_config(served, _generated()) is served
    assert same_config(served, _generated())
    assert publish_config(None, served) == served                       # a new model: its own config


def test_a_legacy_config_is_replaced_once_keeping_its_bounds_for_the_older_versions() -> None:
    served = _legacy()
    published = publish_config(served, _generated())
    assert not same_config(served, _generated())                        # the one-time migration to `all`
    config = parse_config(published)
    assert config.version_policy.HasField("all")
    assert config.parameters[PARAM_N_QUESTIONS].string_value == "4001"  # their model.py copies read these
    assert config.parameters[PARAM_N_SKILLS].string_value == "120"
    assert "run_id" not in config.parameters                            # provenance lives in model_info.json
    assert published.startswith(HEADER)
    for key in (PARAM_N_QUESTIONS, PARAM_N_SKILLS):
        del config.parameters[key]
    assert config == parse_config(_generated())                         # otherwise the generated config
    # deterministic: the next export (any vocabulary) finds the migrated config equal and keeps it
    assert publish_config(published, _generated()) == published
    assert same_config(published, _generated())


def test_other_inputs_or_outputs_replace_the_config() -> None:
    served = _generated()
    with_explain = _generated(explain=True)
    assert publish_config(served, with_explain) == with_explain and not same_config(served, with_explain)
    migrated = publish_config(_legacy(), _generated())
    changed = parse_config(publish_config(migrated, with_explain))       # the bounds still ride along
    assert [t.name for t in changed.output] == list(signature.EXPLAIN.output_names)
    assert changed.parameters[PARAM_N_QUESTIONS].string_value == "4001"


def test_non_python_or_unreadable_served_configs_are_replaced() -> None:
    gpu = render_config("kt", TritonModelOptions(backend=Backend.ONNXRUNTIME, window=20, graph=signature.RANK.name,
                                                 parameters={PARAM_N_QUESTIONS: "7", PARAM_N_SKILLS: "3"}))
    new = _generated()
    assert publish_config(gpu, new) == new
    assert publish_config("max_batch_size: many", new) == new


@pytest.mark.parametrize("kind", ["attention", "recurrent"])
def test_a_rank_model_serving_step_graphs_declares_them_with_every_input_optional(kind: str) -> None:
    from routerkt.contract.step_signature import HELD_INPUTS, STEP_GRAPHS, served_state_kind, step_tensor_names
    config = _round_trip("kt", _options(graph="rank", step_state=kind, window=20))
    inputs, outputs = step_tensor_names(STEP_GRAPHS[kind])
    assert {t.name for t in config.input} == inputs | set(signature.RANK.input_names) | HELD_INPUTS
    assert {t.name for t in config.output} == outputs | set(signature.RANK.output_names)
    assert all(t.optional for t in config.input)
    by_name = {t.name: t for t in list(config.input) + list(config.output)}
    assert list(by_name["state_length"].dims) == [1] and by_name["state_length"].HasField("reshape")
    assert not by_name["history_questions"].HasField("reshape")
    assert served_state_kind(t.name for t in config.input) == kind
    assert served_state_kind(t.name for t in _round_trip("kt", _options(graph="rank")).input) is None
    assert [w.name for w in config.model_warmup] == [WARMUP_NAME]        # warm-up: the rank graph's inputs
    assert set(config.model_warmup[0].inputs) == set(signature.RANK.input_names)


def test_held_states_are_declared_with_one_instance_and_a_budget_only() -> None:
    from routerkt.contract.step_signature import HELD_INPUTS, holds_states
    from export.triton_config import PARAM_HELD_STATE_BYTES
    held = _round_trip("kt", _options(graph="rank", step_state="attention", window=20, held_state_mib=3))
    assert holds_states(t.name for t in held.input)
    assert held.parameters[PARAM_HELD_STATE_BYTES].string_value == str(3 << 20)
    assert all(by.optional and list(by.dims) == [1] and by.HasField("reshape") for by in held.input
               if by.name in HELD_INPUTS)
    for options in ({"held_state_mib": 0}, {"instance_count": 2}):
        config = _round_trip("kt", _options(graph="rank", step_state="attention", window=20, **options))
        assert not holds_states(t.name for t in config.input) and PARAM_HELD_STATE_BYTES not in config.parameters
    with pytest.raises(UserError, match="held_state_mib"):
        render_config("kt", _options(graph="rank", step_state="attention", held_state_mib=-1))


@pytest.mark.parametrize("kwargs", [{"graph": "score", "step_state": "attention"},
                                    {"graph": "rank", "step_state": "lstm"},
                                    {"graph": "rank", "step_state": "attention", "backend": Backend.ONNXRUNTIME}])
def test_step_graphs_are_served_by_the_python_rank_model_only(kwargs: dict) -> None:
    with pytest.raises(UserError, match="step graphs"):
        render_config("kt", _options(**kwargs))
