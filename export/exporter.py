"""`export_run`: turn a training run into a new model version of the Triton repository.

Steps: rebuild the model from the chosen fold's meta.json alone -> refuse non-servable configs ->
ONNX export with frozen biases -> (with fuse_attention: the attention-fusion pass,
export/attention_fusion.py; not for TensorRT, which builds from the plain graph) -> parity check against PyTorch (random batches at several sizes
and lengths, plus real batches when the run's data file is readable) -> the same for the rank graph
(rank.onnx, checked against one PyTorch window per candidate) -> the same for the explain graph
(explain.onnx: python backend and models with attention only; never fused nor quantized, so its
attention is the model's; config.pbtxt then also declares its outputs) -> (TensorRT plan of the score graph
on a GPU host) -> render config.pbtxt -> publish the version atomically. Either parity failing
refuses the export; any failure leaves the repository untouched. With --quantize int8 both graphs
are quantized and each must stay within INT8_TOL.
"""
from __future__ import annotations

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
from export.triton_python_model import MODEL_PY
from export.triton_config import TARGETS, Backend, TritonModelOptions, publish_config, render_config
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


def _check_repository(repository: Path) -> None:
    if repository.exists() and not repository.is_dir():
        raise UserError(f"repository path {repository} is a file")


def real_batches(config, vocab, n: int = 48) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Up to two batches of real windows from the run's data file, read by training's pipeline
    (empty if the file is not readable)."""
    from training.data.pipeline import load_sequences, resolve_data_path
    if not resolve_data_path(config.data.path).is_file():
        return []
    try:
        _, seqs = load_sequences(config.data, vocab)
    except UserError:
        return []
    rng = np.random.default_rng(0)
    idx = rng.choice(len(seqs), size=min(n, len(seqs)), replace=False)
    half = max(1, len(idx) // 2)
    return [(seqs.questions[i], seqs.skills[i], seqs.responses[i]) for i in (idx[:half], idx[half:]) if len(i)]


def export_run(run: Path, repository: Path, name: str | None = None, version: int | None = None,
               backend: Backend = Backend.PYTHON, fold: int | None = None, keep_versions: int = 3,
               options: TritonModelOptions | None = None, quantize: str = "none", fuse_attention: bool = False,
               log=print, policy_file: Path | None = None) -> ExportResult:
    """Export `run` and publish it in `repository`; versions beyond `keep_versions` are pruned except those the
    rollout policy file `policy_file` names (a canary's baseline must stay loaded)."""
    from training.checkpoint import load_checkpoint
    from training.run import best_fold_dir

    run, repository = Path(run), Path(repository)
    _check_repository(repository)
    if not run.exists():
        raise UserError(f"run {run} does not exist")
    fold_dir = run / f"fold-{fold}" if fold is not None else best_fold_dir(run)
    ckpt = load_checkpoint(fold_dir)
    cfg = ckpt.config
    name = name or cfg.preset or "model"
    options = options or TritonModelOptions()
    options.backend = Backend(backend)
    target = TARGETS[options.backend]
    options.window = cfg.model.max_len
    options.graph = target.graph        # rank: the gateway's path (one inference per learner); tensorrt: score
    meta = ckpt.meta
    provenance = {"run_id": str(meta.get("run_id", run.name)), "git_sha": str(meta.get("git_sha", "unknown")),
                  "valid_auc": f"{float(meta.get('valid_auc', float('nan'))):.6f}", "preset": cfg.preset,
                  "fold": str(meta.get("fold", "")), "epoch": str(meta.get("epoch", ""))}
    # config.pbtxt gets no vocabulary sizes and no provenance: both are in the version's model_info.json
    # (model.py reads its id bounds there), so a retrain whose vocabulary grew renders the same config
    # the explain graph rides on the rank model of the python backend (export/triton_python_model/model.py)
    options.explain = target.explain and options.graph == signature.RANK.name and explainable(ckpt.model)
    config_text = render_config(name, options)          # validates name and options before heavy work
    served_config = repository / name / signature.CONFIG_FILE
    config_text = publish_config(served_config.read_text() if served_config.is_file() else None, config_text)
    _check_served_graph(repository, name, options.graph)

    if target.score_file == signature.PLAN_FILE:
        from export.tensorrt import tensorrt_available
        ok, why = tensorrt_available()
        if not ok:
            raise UserError(f"--backend tensorrt needs TensorRT and a GPU on this host: {why}; "
                            "export with --backend onnxruntime here and build the plan on the GPU host "
                            "(see docs/training.md, 'TensorRT')")

    with tempfile.TemporaryDirectory(prefix="routerkt-export-") as tmp:
        onnx_path, rank_path = Path(tmp) / signature.ONNX_FILE, Path(tmp) / signature.RANK_ONNX_FILE
        real = real_batches(cfg, ckpt.vocab)
        started = time.perf_counter()
        export_onnx(ckpt.model, onnx_path)
        fuse = fuse_attention and target.fuse_attention
        if fuse_attention and not fuse:
            log(f"attention fusion: off for --backend {options.backend.value} ({target.note})")
        if fuse:
            log(f"score graph: {_fuse(onnx_path).describe()}")
        report = check_parity(ckpt.model, onnx_path, batches=real)
        log(f"exported {fold_dir} to ONNX in {time.perf_counter() - started:.1f}s; parity max |ort - torch| = "
            f"{report.max_abs_diff:.2e} over {len(report.cases)} batches")
        if not report.ok:
            raise ExportError(f"parity check failed: max |onnxruntime - pytorch| = {report.max_abs_diff:.3e} "
                              f"> {PARITY_TOL:g}; nothing was published")
        started = time.perf_counter()
        export_rank_onnx(ckpt.model, rank_path)
        rank_fusion = _fuse(rank_path) if fuse else FusionReport()
        if fuse:
            log(f"rank graph: {rank_fusion.describe()}")
        rank_report = check_rank_parity(ckpt.model, rank_path, batches=rank_batches(real))
        log(f"exported the rank graph in {time.perf_counter() - started:.1f}s; rank parity max |ort rank - "
            f"torch windows| = {rank_report.max_abs_diff:.2e} over {len(rank_report.cases)} batches")
        if not rank_report.ok:
            raise ExportError(f"rank parity check failed: max |onnxruntime rank - pytorch windows| = "
                              f"{rank_report.max_abs_diff:.3e} > {PARITY_TOL:g}; nothing was published")
        explain_report = None
        if options.explain:
            started = time.perf_counter()
            explain_path = Path(tmp) / signature.EXPLAIN_ONNX_FILE
            export_explain_onnx(ckpt.model, explain_path)
            explain_report = check_explain_parity(ckpt.model, explain_path, batches=rank_batches(real))
            log(f"exported the explain graph in {time.perf_counter() - started:.1f}s; explain parity max |ort - "
                f"torch (probs, attention, head weights)| = {explain_report.max_abs_diff:.2e} over "
                f"{len(explain_report.cases)} batches")
            if not explain_report.ok:
                raise ExportError(f"explain parity check failed: max |onnxruntime explain - pytorch| = "
                                  f"{explain_report.max_abs_diff:.3e} > {PARITY_TOL:g}; nothing was published")
        if quantize == "int8":                # weights of MatMul/Gemm as int8, activations quantized on the fly
            onnx_path, report = _int8(onnx_path, lambda path: check_parity(ckpt.model, path, batches=real), log)
            rank_path, rank_report = _int8(rank_path, lambda path: check_rank_parity(
                ckpt.model, path, batches=rank_batches(real)), log)
        elif quantize != "none":
            raise UserError(f"--quantize {quantize!r}: choose none or int8")
        files: dict[str, Path | bytes] = {signature.VOCAB_FILE: json.dumps(ckpt.vocab.to_json()).encode(),
                                          signature.RANK_ONNX_FILE: rank_path}
        if explain_report is not None:
            files[signature.EXPLAIN_ONNX_FILE] = explain_path
        if target.score_file == signature.PLAN_FILE:
            from export.tensorrt import build_engine
            plan = Path(tmp) / signature.PLAN_FILE
            build_engine(onnx_path, plan, window=options.window, max_batch=options.max_batch_size, fp16=options.fp16)
            files[signature.PLAN_FILE] = plan
        else:
            files[signature.ONNX_FILE] = onnx_path
        if target.model_py:
            files["model.py"] = MODEL_PY
        info = ModelInfo(name=name, window=cfg.model.max_len, n_questions=cfg.model.n_questions,
                         n_skills=cfg.model.n_skills, preset=cfg.preset, backbone=cfg.model.backbone.value,
                         attention=cfg.model.attention.value, heads=cfg.model.heads.value,
                         routing_scope=cfg.model.routing_scope.value, backend=options.backend.value,
                         quantization=quantize, parity_max_abs_diff=report.max_abs_diff,
                         served_graph=options.graph, rank_parity_max_abs_diff=rank_report.max_abs_diff,
                         explain_parity_max_abs_diff=(explain_report.max_abs_diff if explain_report
                                                      else float("nan")),
                         provenance={**provenance, "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        files[signature.INFO_FILE] = info.save_bytes()
        protected = read_named_versions(policy_file).get(name, set())
        version = publish_version(repository, name, files, config_text, version=version, keep_versions=keep_versions,
                                  protected=protected)
    return ExportResult(name=name, version=version, repository=repository, parity_max_abs_diff=report.max_abs_diff,
                        parity_cases=report.cases, files=sorted(files),
                        rank_parity_max_abs_diff=rank_report.max_abs_diff, rank_parity_cases=rank_report.cases,
                        fused_attention_cores=rank_fusion.fused,
                        explain_parity_max_abs_diff=explain_report.max_abs_diff if explain_report else float("nan"))


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
    from routerkt.contract.repository import list_versions, read_model_info
    for version in list_versions(repository, name) if (repository / name).is_dir() else []:
        try:
            served = read_model_info(repository, name, version).served_graph
        except (ModelInfoError, OSError, ValueError):
            continue
        if served != graph:
            raise UserError(f"model {name} version {version} serves the {served} graph and this export the {graph} "
                            f"graph; Triton has one config per model: export under another --name, or remove the "
                            f"old versions first")
