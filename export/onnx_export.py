"""Trace a trained model to ONNX with the shared signature, and check parity with PyTorch.

The model is rebuilt from a checkpoint's meta.json alone (training/checkpoint.py). Before tracing,
learner-independent biases are frozen into constants for the maximum window (ALiBi tables, the
relative recency kernel) and sliced to the actual length inside the graph; monotonic attention
keeps its data-dependent decay. Routed heads are served with the causal `prefix` scope only: a
model trained with the leaking whole-window `sequence` scope is refused.

Exporter: torch.onnx.export(dynamo=True), opset 18, named tensors from routerkt/contract/signature.py.
Two graphs per model, skills as sets [..., K] (a dynamic `skills` axis, 1 .. MAX_SKILLS; traced
with K = 2 so that the axis stays symbolic):
- score (`export_onnx`): dynamic batch and sequence axes (2 .. max_len);
- rank (`export_rank_onnx`, KTModel.rank): dynamic batch, history (1 .. max_len - 1; serving sends
  window - 1) and candidates axes. Its parity check (`check_rank_parity`) compares onnxruntime's
  candidate_probs with the reference, one PyTorch window [history, candidate] per candidate.
"""
from __future__ import annotations

import contextlib
import io
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from routerkt.contract import signature
from routerkt.atomic import atomic_path
from routerkt.contract.onnx_session import cpu_session
from routerkt.errors import UserError
from training.models.kt_model import KTModel

OPSET = 18
PARITY_TOL = 1e-5
MAX_SKILLS = 64          # the largest skill set a served graph accepts (the gateway caps requests lower)
EXAMPLE_SKILLS = 2       # K of the traced example and of the random parity inputs


class ExportError(UserError):
    """Export refused or failed (one line)."""


class InferenceModel(nn.Module):
    """The served function: questions, responses [B, L] and skills [B, L, K] -> probs [B, L]."""

    def __init__(self, model: KTModel):
        super().__init__()
        self.model = model

    def forward(self, questions: Tensor, skills: Tensor, responses: Tensor) -> Tensor:
        return torch.sigmoid(self.model(questions, skills, responses).logits)


class RankInferenceModel(nn.Module):
    """The rank graph: history [B, H] and candidates [B, N] (skills [.., K]) -> candidate_probs [B, N]."""

    def __init__(self, model: KTModel):
        super().__init__()
        self.model = model

    def forward(self, history_questions: Tensor, history_skills: Tensor, history_responses: Tensor,
                candidate_questions: Tensor, candidate_skills: Tensor) -> Tensor:
        return torch.sigmoid(self.model.rank(history_questions, history_skills, history_responses,
                                             candidate_questions, candidate_skills))


def check_servable(model: KTModel) -> None:
    cfg = model.config
    if cfg.leaks_future:
        raise ExportError("this model routes with the whole-window 'sequence' scope, which reads future "
                          "interactions; only causal scopes (prefix, token) can be served; retrain with "
                          "--set model.routing_scope=prefix")


def skill_sets(rng: np.random.Generator, n_skills: int, shape: tuple[int, ...], width: int) -> np.ndarray:
    """Random skill sets int64 [*shape, width]: 1..width real skills each, packed from slot 0."""
    high = max(n_skills, signature.FIRST_ID + 1)
    first = rng.integers(signature.FIRST_ID, high, shape)[..., None]
    if width == 1:
        return first.astype(np.int64)
    sets = np.concatenate([first, rng.integers(signature.FIRST_ID, high, (*shape, width - 1))], axis=-1)
    sizes = rng.integers(1, width + 1, shape)[..., None]
    sets[np.arange(width) >= sizes] = signature.PAD_ID
    return sets.astype(np.int64)


def example_inputs(n_questions: int, n_skills: int, batch: int, length: int, seed: int = 0,
                   min_len: int = 1, skills: int = EXAMPLE_SKILLS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random left-padded int64 batches with a random real length per row: questions and
    responses [B, L], skill sets [B, L, skills]."""
    rng = np.random.default_rng(seed)
    q = rng.integers(signature.FIRST_ID, max(n_questions, signature.FIRST_ID + 1), (batch, length))
    s = skill_sets(rng, n_skills, (batch, length), skills)
    r = rng.integers(0, 2, (batch, length))
    lengths = rng.integers(min(min_len, length), length + 1, batch)
    lengths[0] = length                                                    # one full row
    for b, n in enumerate(lengths):
        q[b, : length - n], s[b, : length - n], r[b, : length - n] = 0, 0, -1
    return q.astype(np.int64), s, r.astype(np.int64)


def rank_inputs(n_questions: int, n_skills: int, batch: int, history: int, candidates: int,
                seed: int = 0, skills: int = EXAMPLE_SKILLS) -> tuple[np.ndarray, ...]:
    """Random rank-graph inputs: left-padded histories [B, H] of random length (row 0 full, row 1
    empty) and real candidates [B, N] (skill sets [.., skills]), the last one of the last row a
    padding candidate."""
    rng = np.random.default_rng(seed)
    histories = example_inputs(n_questions, n_skills, batch, history, seed=seed, min_len=0, skills=skills)
    if batch > 1:                           # row 1: an empty history (questions, skills, responses all padding)
        for array, pad in zip(histories, (signature.PAD_ID, signature.PAD_ID, signature.PAD_RESPONSE)):
            array[1] = pad
    candidate_questions = rng.integers(signature.FIRST_ID, max(n_questions, signature.FIRST_ID + 1),
                                       (batch, candidates))
    candidate_skills = skill_sets(rng, n_skills, (batch, candidates), skills)
    if candidates > 1:
        candidate_questions[-1, -1] = candidate_skills[-1, -1] = signature.PAD_ID
    return *histories, candidate_questions.astype(np.int64), candidate_skills


def candidate_windows(*rank_arrays: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Today's per-candidate rows from the rank graph's five inputs (history questions, skills, responses
    [B, H(, K)]; candidate questions, skills [B, N(, K)]): [B*N, H+1] windows [history_b, candidate_(b, j)],
    row b*N + j (skills [B*N, H+1, K])."""
    history_questions, history_skills, history_responses, candidate_questions, candidate_skills = rank_arrays
    N = candidate_questions.shape[1]
    candidate_responses = np.full_like(candidate_questions, signature.CANDIDATE_RESPONSE)
    rows = [np.concatenate([np.repeat(history, N, axis=0), candidate.reshape(-1, 1, *candidate.shape[2:])], axis=1)
            for history, candidate in ((history_questions, candidate_questions), (history_skills, candidate_skills),
                                       (history_responses, candidate_responses))]
    return rows[0], rows[1], rows[2]


def rank_reference(model: KTModel, *rank_arrays: np.ndarray) -> np.ndarray:
    """[B, N] P(correct) of each candidate from its own window through the PyTorch model (the rank graph's
    five inputs, as `candidate_windows`)."""
    q, s, r = (torch.from_numpy(a) for a in candidate_windows(*rank_arrays))
    with torch.no_grad():
        probs = torch.sigmoid(model(q, s, r).logits[:, -1])
    return probs.numpy().reshape(rank_arrays[3].shape)


# PyTorch 2.13 caches the kernel each OpOverload resolves to per dispatch key. The ONNX exporter's
# first trace of an LSTM keeps its sequence axis symbolic; a later export in the same process reuses
# a cached kernel that specializes it to the example's length (a DKT rank graph exported after its
# score graph took only 15 history steps). Clearing these ops' caches before each export avoids it;
# `_check_dynamic` refuses any graph whose axes came out fixed anyway.
_RECURRENT_OPS = ("lstm", "gru", "rnn_tanh", "rnn_relu")


def _clear_recurrent_dispatch_caches() -> None:
    for name in _RECURRENT_OPS:
        packet = getattr(torch.ops.aten, name)
        for overload in packet.overloads():
            getattr(packet, overload)._dispatch_cache.clear()


def _check_dynamic(model_proto, graph: signature.Graph, dynamic: dict) -> None:
    """Every axis exported as dynamic is symbolic in the ONNX graph (else ExportError)."""
    for value in model_proto.graph.input:
        dims = value.type.tensor_type.shape.dim
        for axis in dynamic.get(value.name, {}):
            if axis < len(dims) and not dims[axis].dim_param:
                raise ExportError(f"ONNX export of the {graph.name} graph fixed axis {axis} of {value.name} to "
                                  f"{dims[axis].dim_value} instead of keeping it dynamic; nothing was written")


def trace_graph(wrapper: nn.Module, inputs: tuple[Tensor, ...], graph: signature.Graph, dynamic: dict,
                path: Path, quiet: bool) -> None:
    """Export `wrapper` on example `inputs` as `graph` (its tensor names) with the `dynamic` axes to `path`
    (single file, weights embedded); ExportError when the exporter fails or fixes a dynamic axis."""
    path = Path(path)
    _clear_recurrent_dispatch_caches()
    path.parent.mkdir(parents=True, exist_ok=True)
    sink = io.StringIO()
    redirect = contextlib.redirect_stdout(sink) if quiet else contextlib.nullcontext()
    with warnings.catch_warnings(), redirect:
        warnings.simplefilter("ignore")
        if quiet:
            logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        try:
            with torch.no_grad():
                program = torch.onnx.export(
                    wrapper, inputs, dynamo=True, opset_version=OPSET, external_data=False,
                    input_names=list(graph.input_names), output_names=list(graph.output_names),
                    dynamic_shapes=dynamic, verbose=False)
        except Exception as exc:  # the exporter raises many types; report one line, keep the cause
            raise ExportError(f"ONNX export of the {graph.name} graph failed: {type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:300]}") from exc
    _check_dynamic(program.model_proto, graph, dynamic)
    with atomic_path(path) as tmp:
        program.save(str(tmp))


def prepare_model(model: KTModel) -> None:
    """Before any trace: refuse a non-servable model, eval mode, learner-independent biases frozen."""
    check_servable(model)
    model.eval()
    model.freeze_biases()


def export_onnx(model: KTModel, path: Path, quiet: bool = True) -> None:
    """Freeze biases and write the score graph to `path` (single file, weights embedded)."""
    prepare_model(model)
    cfg = model.config
    L = min(cfg.max_len, 16)
    inputs = tuple(torch.from_numpy(a) for a in example_inputs(cfg.n_questions, cfg.n_skills, 2, L))
    trace_graph(InferenceModel(model).eval(), inputs, signature.SCORE, dynamic_axes(cfg.max_len, signature.SCORE),
                path, quiet)


def export_rank_onnx(model: KTModel, path: Path, quiet: bool = True) -> None:
    """Freeze biases and write the rank graph to `path` (single file, weights embedded)."""
    export_rank_inputs_graph(RankInferenceModel(model), signature.RANK, path, quiet)


def export_rank_inputs_graph(served: nn.Module, graph: signature.Graph, path: Path, quiet: bool = True) -> None:
    """Freeze the biases of `served.model` and trace `served`, a module over the rank graph's inputs
    (the rank and explain graphs), with the rank graph's dynamic axes."""
    model = served.model
    prepare_model(model)
    cfg = model.config
    arrays = rank_inputs(cfg.n_questions, cfg.n_skills, 2, min(cfg.max_len - 1, 15), 3)
    trace_graph(served.eval(), tuple(torch.from_numpy(a) for a in arrays), graph, dynamic_axes(cfg.max_len, graph),
                path, quiet)


def dynamic_axes(max_len: int, graph: signature.Graph) -> dict:
    """Each input's dynamic axes, by axis name: batch, seq (2 .. max_len), history (1 .. max_len - 1), appended
    (1 .. max_len - 1), candidates, skills (every graph; any other axis, e.g. a step state's layers or heads,
    stays fixed)."""
    dims = {"batch": torch.export.Dim("batch", min=1, max=1 << 16),
            "seq": torch.export.Dim("seq", min=2, max=max_len),
            "history": torch.export.Dim("history", min=1, max=max_len - 1),
            "appended": torch.export.Dim("appended", min=1, max=max(max_len - 1, 2)),
            "candidates": torch.export.Dim("candidates", min=1, max=1 << 16),
            "skills": torch.export.Dim("skills", min=1, max=MAX_SKILLS)}
    return {spec.name: {i: dims[axis] for i, axis in enumerate(spec.axes) if axis in dims} for spec in graph.inputs}


@dataclass
class ParityReport:
    max_abs_diff: float
    cases: list[tuple]   # (batch, length, max abs diff); rank: (batch, history, candidates, max abs diff)

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= PARITY_TOL


def check_parity(model: KTModel, onnx_path: Path,
                 batches: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None,
                 shapes: tuple[tuple[int, int], ...] = ((1, 100), (7, 37), (64, 100), (3, 2)),
                 session=None) -> ParityReport:
    """Max |onnxruntime - PyTorch| over random batches of `shapes` (lengths capped at max_len) and
    any given real batches."""
    cfg = model.config
    model.eval()
    sess = session or cpu_session(onnx_path)
    cases_in = [example_inputs(cfg.n_questions, cfg.n_skills, b, min(L, cfg.max_len), seed=i)
                for i, (b, L) in enumerate(shapes)] + list(batches or [])
    cases = []
    for q, s, r in cases_in:
        with torch.no_grad():
            ref = torch.sigmoid(model(torch.from_numpy(q), torch.from_numpy(s), torch.from_numpy(r)).logits).numpy()
        got = sess.run([signature.PROBS], {"questions": q, "skills": s, "responses": r})[0]
        valid = (s != signature.PAD_ID).any(axis=-1)
        diff = float(np.abs(got - ref)[valid].max()) if valid.any() else 0.0
        cases.append((q.shape[0], q.shape[1], diff))
    return ParityReport(max_abs_diff=max(c[-1] for c in cases), cases=cases)


def rank_batches(windows: list[tuple[np.ndarray, np.ndarray, np.ndarray]], candidates: int = 16,
                 seed: int = 0) -> list[tuple[np.ndarray, ...]]:
    """Rank-graph inputs from real windows [B, L] (skills [B, L, K]): each row's last L-1
    interactions as the history, candidates drawn from the real (question, skill set) pairs of the batch."""
    rng = np.random.default_rng(seed)
    out = []
    for q, s, r in windows:
        pairs = np.flatnonzero((s != signature.PAD_ID).any(axis=-1))
        if not len(pairs):
            continue
        pick = rng.choice(pairs, size=(q.shape[0], candidates))
        history = (np.ascontiguousarray(a[:, 1:]) for a in (q, s, r))
        out.append((*history, q.reshape(-1)[pick], s.reshape(-1, s.shape[-1])[pick]))
    return out


def check_rank_parity(model: KTModel, onnx_path: Path, batches: list[tuple[np.ndarray, ...]] | None = None,
                      shapes: tuple[tuple[int, int, int], ...] | None = None, session=None) -> ParityReport:
    """Max |onnxruntime rank graph - PyTorch per-candidate windows| over valid candidates, for
    random inputs of `shapes` (batch, history, candidates; default: history window - 1 with 1, 16
    and 64 candidates, and a short history) and any given rank inputs."""
    cfg = model.config
    model.eval()
    sess = session or cpu_session(onnx_path)
    H = cfg.max_len - 1
    shapes = shapes or ((1, H, 1), (4, H, 16), (2, H, 64), (3, min(H, 5), 7))
    cases_in = [rank_inputs(cfg.n_questions, cfg.n_skills, b, min(h, H), n, seed=i)
                for i, (b, h, n) in enumerate(shapes)] + list(batches or [])
    cases = []
    for arrays in cases_in:
        ref = rank_reference(model, *arrays)
        got = sess.run([signature.CANDIDATE_PROBS], dict(zip(signature.RANK.input_names, arrays)))[0]
        valid = (arrays[4] != signature.PAD_ID).any(axis=-1)
        diff = float(np.abs(got - ref)[valid].max()) if valid.any() else 0.0
        cases.append((*arrays[1].shape[:2], arrays[4].shape[1], diff))
    return ParityReport(max_abs_diff=max(c[-1] for c in cases), cases=cases)
