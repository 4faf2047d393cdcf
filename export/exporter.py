"""`export_run`: turn a training run into a new model version of the Triton repository.

Steps: rebuild the model from the chosen fold's meta.json alone -> refuse non-servable configs ->
for each graph of GRAPH_KINDS (score, rank, explain): ONNX export with frozen biases -> (with
fuse_attention: the attention-fusion pass, export/attention_fusion.py, on the score and rank graphs;
not for TensorRT, which builds from the plain graph) -> parity check against PyTorch. The score graph
is checked on random batches at several sizes and lengths, plus real batches when the run's data file
is readable; the rank graph (rank.onnx) against one PyTorch window per candidate; the explain graph
(explain.onnx: python backend and models with attention only; never fused nor quantized, so its
attention is the model's; config.pbtxt then also declares its outputs) likewise. Then (TensorRT plan
of the score graph on a GPU host) -> render config.pbtxt -> publish the version atomically. Any parity
failing refuses the export; any failure leaves the repository untouched. With --quantize int8 the
score and rank graphs are quantized and each must stay within INT8_TOL. With step_graphs (`--step-graphs`)
the step graphs (export/step_export.py) are exported and checked too, and model_info.json names them.
"""
from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from export.attention_fusion import FusionReport, fuse_attention_file
from export.explain_export import check_explain_parity, explainable, export_explain_onnx
from export.onnx_export import (PARITY_TOL, ExportError, check_parity, check_rank_parity, export_onnx,
                                ParityReport, export_rank_onnx, rank_batches)
from export.repository import publish_version
from export.step_export import export_step_graphs, step_graphs_of
from export.triton_python_model import PYTHON_MODEL_FILES
from export.triton_config import TARGETS, Backend, Target, TritonModelOptions, publish_config, render_config
from routerkt.contract import signature
from routerkt.contract.rollout_versions import read_named_versions
from routerkt.contract.model_info import ModelInfo
from routerkt.errors import UserError

INT8_TOL = 0.02   # max |P(int8) - P(float32 PyTorch)| accepted for --quantize int8


@dataclass
class ExportResult:
    name: str
    version: int
    repository: Path
    parity_max_abs_diff: float
    parity_cases: list = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    rank_parity_max_abs_diff: float = float("nan")
    rank_parity_cases: list = field(default_factory=list)
    fused_attention_cores: int = 0        # attention cores of the served graph as one fused op each
    explain_parity_max_abs_diff: float = float("nan")   # nan: no explain graph exported
    step_parity_max_abs_diff: float = float("nan")      # nan: no step graphs exported


@dataclass(frozen=True)
class GraphKind:
    """One graph a version ships: how it is exported and checked, and how its log line and refusal read.
    `export` and `check` look the module's functions up when called (tests replace them)."""

    kind: str                                 # score | rank | explain
    file: str                                 # its file in the version folder (score: before any plan)
    export: Callable[..., None]               # (model, path)
    check: Callable[..., ParityReport]        # (model, path, batches)
    per_candidate: bool                       # checked on rank_batches(real): one window per candidate
    fusable: bool                             # the attention-fusion pass applies
    quantizable: bool                         # --quantize int8 applies
    subject: str                              # "exported <subject> in ...s"
    measure: str                              # what its parity line compares
    refusal: str                              # what its failed parity check compares

    @property
    def parity(self) -> str:
        return "parity" if self.kind == "score" else f"{self.kind} parity"


GRAPH_KINDS: tuple[GraphKind, ...] = (
    GraphKind("score", signature.ONNX_FILE, lambda model, path: export_onnx(model, path),
          lambda model, path, batches: check_parity(model, path, batches=batches),
          per_candidate=False, fusable=True, quantizable=True, subject="{fold_dir} to ONNX",
          measure="|ort - torch|", refusal="|onnxruntime - pytorch|"),
    GraphKind("rank", signature.RANK_ONNX_FILE, lambda model, path: export_rank_onnx(model, path),
          lambda model, path, batches: check_rank_parity(model, path, batches=batches),
          per_candidate=True, fusable=True, quantizable=True, subject="the rank graph",
          measure="|ort rank - torch windows|", refusal="|onnxruntime rank - pytorch windows|"),
    GraphKind("explain", signature.EXPLAIN_ONNX_FILE, lambda model, path: export_explain_onnx(model, path),
          lambda model, path, batches: check_explain_parity(model, path, batches=batches),
          per_candidate=True, fusable=False, quantizable=False, subject="the explain graph",
          measure="|ort - torch (probs, attention, head weights)|", refusal="|onnxruntime explain - pytorch|"),
)


@dataclass
class Exported:
    """One graph exported and checked: its file (int8 once quantized), parity and fusion reports."""

    path: Path
    report: ParityReport
    fusion: FusionReport = field(default_factory=FusionReport)


def _check_repository(repository: Path) -> None:
    if repository.exists() and not repository.is_dir():
        raise UserError(f"repository path {repository} is a file")


def real_batches(config, vocab, n: int = 48) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Up to two batches of real windows from the run's data file, read by training's pipeline
    (empty if the file is not readable); a band model's whole histories as their last max_len (what the
    score, rank and explain graphs take)."""
    from training.config import Protocol
    from training.data.pipeline import load_sequences, resolve_data_path
    if not resolve_data_path(config.data.path).is_file():
        return []
    data = config.data
    if data.protocol is Protocol.WHOLE:
        data = dataclasses.replace(data, protocol=Protocol.RECENT, window=config.model.max_len)
    try:
        _, seqs = load_sequences(data, vocab)
    except UserError:
        return []
    rng = np.random.default_rng(0)
    idx = rng.choice(len(seqs), size=min(n, len(seqs)), replace=False)
    half = max(1, len(idx) // 2)
    return [(seqs.questions[i], seqs.skills[i], seqs.responses[i]) for i in (idx[:half], idx[half:]) if len(i)]


def export_run(run: Path, repository: Path, name: str | None = None, version: int | None = None,
               backend: Backend = Backend.PYTHON, fold: int | None = None, keep_versions: int = 3,
               options: TritonModelOptions | None = None, quantize: str = "none", fuse_attention: bool = False,
               log=print, policy_file: Path | None = None, step_graphs: bool = False) -> ExportResult:
    """Export `run` and publish it in `repository`; versions beyond `keep_versions` are pruned except those the
    rollout policy file `policy_file` names (a canary's baseline must stay loaded). `step_graphs`: the
    step graphs too, where the model can be stepped."""
    from training.checkpoint import load_checkpoint
    from training.training_run import best_fold_dir

    run, repository = Path(run), Path(repository)
    _check_repository(repository)
    if not run.exists():
        raise UserError(f"run {run} does not exist")
    fold_dir = run / f"fold-{fold}" if fold is not None else best_fold_dir(run)
    ckpt = load_checkpoint(fold_dir)
    name = name or ckpt.config.preset or "model"
    options, target = _serving_options(options, backend, ckpt, step_graphs)
    config_text = _config_text(repository, name, options)      # validates name and options before heavy work
    _check_served_graph(repository, name, options.graph)
    if target.score_file == signature.PLAN_FILE:
        _require_tensorrt()

    with tempfile.TemporaryDirectory(prefix="routerkt-export-") as tmp:
        kinds = [graph for graph in GRAPH_KINDS if graph.kind != "explain" or options.explain]
        exported = _export_graphs(ckpt, kinds, Path(tmp), fold_dir, fuse_attention, target, options, quantize, log)
        files = _version_files(ckpt, exported, target, options, Path(tmp))
        step = export_step_graphs(ckpt.model, Path(tmp) / "step", log) if step_graphs else None
        files.update(step.files if step else {})
        info = _model_info(ckpt, run, name, options, quantize, exported)
        if step:
            info = dataclasses.replace(info, step_graphs=step.graphs.names(),
                                       step_parity_max_abs_diff=step.report.max_abs_diff,
                                       held_states=target.model_py)   # this model.py runs the held graphs
        files[signature.INFO_FILE] = info.save_bytes()
        protected = read_named_versions(policy_file).get(name, set())
        version = publish_version(repository, name, files, config_text, version=version, keep_versions=keep_versions,
                                  protected=protected)
    score, rank = exported["score"].report, exported["rank"]
    return ExportResult(name=name, version=version, repository=repository, parity_max_abs_diff=score.max_abs_diff,
                        parity_cases=score.cases, files=sorted(files),
                        rank_parity_max_abs_diff=rank.report.max_abs_diff, rank_parity_cases=rank.report.cases,
                        fused_attention_cores=rank.fusion.fused,
                        explain_parity_max_abs_diff=_explain_parity(exported),
                        step_parity_max_abs_diff=step.report.max_abs_diff if step else float("nan"))


def _serving_options(options: TritonModelOptions | None, backend: Backend, ckpt,
                     step_graphs: bool = False) -> tuple[TritonModelOptions, Target]:
    """The options completed from the checkpoint and the backend's target: window, served graph (rank: the
    gateway's path, one inference per learner; tensorrt: score) and whether the explain graph and (asked
    for, and the model can be stepped) the step graphs ride along (on the rank model of the python
    backend, export/triton_python_model/model.py)."""
    options = options or TritonModelOptions()
    options.backend = Backend(backend)
    target = TARGETS[options.backend]
    options.window = ckpt.config.model.max_len
    options.graph = target.graph
    options.explain = target.explain and options.graph == signature.RANK.name and explainable(ckpt.model)
    stepped = step_graphs_of(ckpt.model) if step_graphs and target.steps and options.graph == signature.RANK.name \
        else None
    options.step_state = stepped.state_kind if stepped else None
    if ckpt.config.model.band and stepped is None:
        raise UserError("a band model (model.context=band) is served through its step graphs beyond its band: export "
                        "it to the python backend, without --no-step-graphs")
    return options, target


def _config_text(repository: Path, name: str, options: TritonModelOptions) -> str:
    """The config.pbtxt to publish: no vocabulary sizes and no provenance (both are in the version's
    model_info.json, where model.py reads its id bounds), so a retrain whose vocabulary grew renders the
    same config."""
    config_text = render_config(name, options)
    served_config = repository / name / signature.CONFIG_FILE
    return publish_config(served_config.read_text() if served_config.is_file() else None, config_text)


def _require_tensorrt() -> None:
    from export.tensorrt import tensorrt_available
    ok, why = tensorrt_available()
    if not ok:
        raise UserError(f"--backend tensorrt needs TensorRT and a GPU on this host: {why}; "
                        "export with --backend onnxruntime here and build the plan on the GPU host "
                        "(see docs/training.md, 'TensorRT')")


def _export_graphs(ckpt, graphs: list[GraphKind], tmp: Path, fold_dir: Path, fuse_attention: bool, target: Target,
                   options: TritonModelOptions, quantize: str, log) -> dict[str, Exported]:
    """Every graph exported and checked in turn, then (--quantize int8) the quantizable ones quantized."""
    real = real_batches(ckpt.config, ckpt.vocab)
    fuse = fuse_attention and target.fuse_attention
    if fuse_attention and not fuse:
        log(f"attention fusion: off for --backend {options.backend.value} ({target.note})")
    exported = {graph.kind: _export_graph(graph, ckpt.model, tmp / graph.file, real, fuse, fold_dir, log)
                for graph in graphs}
    if quantize == "int8":                # weights of MatMul/Gemm as int8, activations quantized on the fly
        for graph in graphs:
            if graph.quantizable:
                _quantize(graph, exported[graph.kind], ckpt.model, _batches(graph, real), log)
    elif quantize != "none":
        raise UserError(f"--quantize {quantize!r}: choose none or int8")
    return exported


def _quantize(graph: GraphKind, exported: Exported, model, batches: list, log) -> None:
    """Replace an exported graph by its int8 quantization, once that passes its parity check."""
    exported.path, exported.report = _int8(exported.path, lambda path: graph.check(model, path, batches), log)


def _batches(graph: GraphKind, real: list) -> list:
    return rank_batches(real) if graph.per_candidate else real


def _export_graph(graph: GraphKind, model, path: Path, real: list, fuse: bool, fold_dir: Path, log) -> Exported:
    """Export one graph, fuse its attention cores (when asked and it applies), check its parity, log it;
    ExportError when the parity check fails."""
    started = time.perf_counter()
    graph.export(model, path)
    fusion = FusionReport()
    if fuse and graph.fusable:
        fusion = _fuse(path)
        log(f"{graph.kind} graph: {fusion.describe()}")
    report = graph.check(model, path, _batches(graph, real))
    log(f"exported {graph.subject.format(fold_dir=fold_dir)} in {time.perf_counter() - started:.1f}s; "
        f"{graph.parity} max {graph.measure} = {report.max_abs_diff:.2e} over {len(report.cases)} batches")
    if not report.ok:
        raise ExportError(f"{graph.parity} check failed: max {graph.refusal} = {report.max_abs_diff:.3e} "
                          f"> {PARITY_TOL:g}; nothing was published")
    return Exported(path, report, fusion)


def _version_files(ckpt, exported: dict[str, Exported], target: Target, options: TritonModelOptions,
                   tmp: Path) -> dict[str, Path | bytes]:
    """The version folder's files but model_info.json: vocabulary, graphs (the score graph as a TensorRT plan
    for that backend) and the python backend's model.py."""
    files: dict[str, Path | bytes] = {signature.VOCAB_FILE: json.dumps(ckpt.vocab.to_json()).encode(),
                                      signature.RANK_ONNX_FILE: exported["rank"].path}
    if "explain" in exported:
        files[signature.EXPLAIN_ONNX_FILE] = exported["explain"].path
    if target.score_file == signature.PLAN_FILE:
        from export.tensorrt import build_engine
        plan = tmp / signature.PLAN_FILE
        build_engine(exported["score"].path, plan, window=options.window, max_batch=options.max_batch_size,
                     fp16=options.fp16)
        files[signature.PLAN_FILE] = plan
    else:
        files[signature.ONNX_FILE] = exported["score"].path
    if target.model_py:
        files.update(PYTHON_MODEL_FILES)
    return files


def _model_info(ckpt, run: Path, name: str, options: TritonModelOptions, quantize: str,
                exported: dict[str, Exported]) -> ModelInfo:
    """The version's model_info.json: the model, its graphs' parity and where it came from."""
    model, meta = ckpt.config.model, ckpt.meta
    provenance = {"run_id": str(meta.get("run_id", run.name)), "git_sha": str(meta.get("git_sha", "unknown")),
                  "valid_auc": f"{float(meta.get('valid_auc', float('nan'))):.6f}", "preset": ckpt.config.preset,
                  "fold": str(meta.get("fold", "")), "epoch": str(meta.get("epoch", "")),
                  "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return ModelInfo(name=name, window=model.max_len, n_questions=model.n_questions, n_skills=model.n_skills,
                     preset=ckpt.config.preset, backbone=model.backbone.value, attention=model.attention.value,
                     heads=model.heads.value, routing_scope=model.routing_scope.value,
                     backend=options.backend.value, quantization=quantize,
                     parity_max_abs_diff=exported["score"].report.max_abs_diff, served_graph=options.graph,
                     rank_parity_max_abs_diff=exported["rank"].report.max_abs_diff,
                     explain_parity_max_abs_diff=_explain_parity(exported), provenance=provenance,
                     context=model.context.value)


def _explain_parity(exported: dict[str, Exported]) -> float:
    return exported["explain"].report.max_abs_diff if "explain" in exported else float("nan")


def _fuse(path: Path) -> FusionReport:
    """The attention-fusion pass on one exported graph, in place (its parity check follows)."""
    return fuse_attention_file(path, path)


def _int8(onnx_path: Path, parity: Callable[[Path], ParityReport], log) -> tuple[Path, ParityReport]:
    """Dynamic int8 quantization of one graph, checked by `parity` against INT8_TOL."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    quantized = onnx_path.with_suffix(".int8.onnx")
    # 7-bit weights (reduce_range): x86 CPUs without VNNI saturate u8 x s8 products otherwise
    quantize_dynamic(str(onnx_path), str(quantized), weight_type=QuantType.QInt8, reduce_range=True)
    report = parity(quantized)
    log(f"int8 (dynamic quantization) {onnx_path.name}: max |ort int8 - torch| = {report.max_abs_diff:.2e}")
    if report.max_abs_diff > INT8_TOL:
        raise ExportError(f"int8 parity check of {onnx_path.name} failed: max |int8 - pytorch| = "
                          f"{report.max_abs_diff:.3e} > {INT8_TOL:g}; export without --quantize")
    return quantized, report


def _check_served_graph(repository: Path, name: str, graph: str) -> None:
    """Triton keeps ONE config.pbtxt per model, so every version of a model must serve the same graph
    (the same input tensors): a version of another graph would make the older ones unloadable."""
    from routerkt.contract.model_info import ModelInfoError
    from routerkt.contract.repository_reader import list_versions, read_model_info
    for version in list_versions(repository, name) if (repository / name).is_dir() else []:
        try:
            served = read_model_info(repository, name, version).served_graph
        except (ModelInfoError, OSError, ValueError):
            continue
        if served != graph:
            raise UserError(f"model {name} version {version} serves the {served} graph and this export the {graph} "
                            f"graph; Triton has one config per model: export under another --name, or remove the "
                            f"old versions first")
