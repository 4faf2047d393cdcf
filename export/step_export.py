"""The step graphs (routerkt/contract/step_signature.py): export beside the rank graph, and their parity check.

`export_step_graphs` traces export/step_modules.py's three modules with the rank graph's exporter
(export/onnx_export.py: dynamic batch, history 1 .. max_len - 1, appended, candidates and skills axes; the
model's layers, heads, head width, sums and LSTM width fixed) and checks them in onnxruntime against one
PyTorch window per candidate (`rank_reference`): the state of a history, then of that history with one and
with two more interactions appended; for a band model also a full state with W - 1 more appended in one
call, then one more (the PyTorch reference then runs the whole longer history through the band). A model
the step path cannot step gets none (one log line says why).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from export.onnx_export import (EXAMPLE_SKILLS, PARITY_TOL, ExportError, ParityReport, dynamic_axes, prepare_model,
                                rank_inputs, rank_reference, skill_sets, trace_graph)
from export.step_modules import step_modules
from routerkt.contract import signature
from routerkt.contract.onnx_session import cpu_session
from routerkt.contract.step_signature import ATTENTION, RECURRENT, STEP_FILES, STEP_GRAPHS, StepGraphs
from training.models.kt_model import KTModel
from training.models.step import Stepping, stepping


@dataclass
class StepExport:
    """The step graphs written for one model: their files (version-folder name -> path) and parity."""

    graphs: StepGraphs
    files: dict[str, Path]
    report: ParityReport
    state_bytes: int = 0                 # one learner's state at history max_len - 1


def step_graphs_of(model: KTModel) -> StepGraphs | None:
    """The contract's step graphs for `model`'s state kind, or None (the step path cannot step it)."""
    kind = stepping(model)
    return {Stepping.ATTENTION: STEP_GRAPHS[ATTENTION], Stepping.RECURRENT: STEP_GRAPHS[RECURRENT]}.get(kind)


def why_not_steppable(model: KTModel) -> str:
    if model.config.leaks_future:
        return ("its routing scope 'sequence' averages over the whole window (every cached position changes "
                "with each answer)")
    return f"the step path has no incremental state for the {model.config.backbone.value} backbone"


def _appended(model: KTModel, batch: int, seed: int, skills: int = EXAMPLE_SKILLS, k: int = 1) -> tuple[np.ndarray, ...]:
    """k random interactions per learner: questions, responses [B, k], skill sets [B, k, skills]."""
    rng = np.random.default_rng(seed)
    cfg = model.config
    question = rng.integers(signature.FIRST_ID, max(cfg.n_questions, signature.FIRST_ID + 1), (batch, k))
    return (question.astype(np.int64), skill_sets(rng, cfg.n_skills, (batch, k), skills),
            rng.integers(0, 2, (batch, k)).astype(np.int64))


def _eager(module, arrays) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        out = module(*(torch.as_tensor(a) for a in arrays))
    return out if isinstance(out, tuple) else (out,)


def export_step_graphs(model: KTModel, folder: Path, log=print, quiet: bool = True) -> StepExport | None:
    """Write step_start/step_append/step_next.onnx into `folder` and check them (ExportError when parity
    fails); None, with one log line, for a model the step path cannot step."""
    graphs = step_graphs_of(model)
    if graphs is None:
        log(f"step graphs: none exported: {why_not_steppable(model)}")
        return None
    started = time.perf_counter()
    prepare_model(model)
    cfg = model.config
    start, append, next_ = (m.eval() for m in step_modules(model))
    history = rank_inputs(cfg.n_questions, cfg.n_skills, 2, min(cfg.max_len - 1, 15), 3)
    state = _eager(start, history[:3])
    examples = {graphs.start.name: history[:3], graphs.append.name: (*state, *_appended(model, 2, seed=1, k=2)),
                graphs.next.name: (*state, *history[3:])}
    files = {}
    for graph, module in zip(graphs.graphs, (start, append, next_)):
        path = Path(folder) / STEP_FILES[graph.name]
        inputs = tuple(torch.as_tensor(a) for a in examples[graph.name])
        trace_graph(module, inputs, graph, dynamic_axes(cfg.max_len, graph), path, quiet)
        files[STEP_FILES[graph.name]] = path
    report = check_step_parity(model, folder, graphs)
    full = rank_inputs(cfg.n_questions, cfg.n_skills, 1, cfg.max_len - 1, 1)
    state_bytes = sum(t.numel() * t.element_size() for t in _eager(start, full[:3]))
    log(f"exported the step graphs ({graphs.state_kind} state, {state_bytes:,} bytes per learner) in "
        f"{time.perf_counter() - started:.1f}s; step parity max |ort step - torch windows| = "
        f"{report.max_abs_diff:.2e} over {len(report.cases)} batches")
    if not report.ok:
        raise ExportError(f"step parity check failed: max |onnxruntime step - pytorch windows| = "
                          f"{report.max_abs_diff:.3e} > {PARITY_TOL:g}; nothing was published")
    return StepExport(graphs, files, report, state_bytes)


class StepSessions:
    """onnxruntime sessions of a folder's three step graphs, called with numpy arrays in contract order."""

    def __init__(self, folder: Path, graphs: StepGraphs):
        self.graphs = graphs
        self.sessions = {g.name: cpu_session(Path(folder) / STEP_FILES[g.name]) for g in graphs.graphs}

    def _run(self, graph: signature.Graph, arrays) -> list[np.ndarray]:
        return self.sessions[graph.name].run(list(graph.output_names), dict(zip(graph.input_names, arrays)))

    def start(self, *history: np.ndarray) -> list[np.ndarray]:
        """history questions, skills, responses -> the state."""
        return self._run(self.graphs.start, history)

    def append(self, state, questions: np.ndarray, skills: np.ndarray, responses: np.ndarray) -> list[np.ndarray]:
        """state + questions, responses [B, k], skills [B, k, K] -> the updated state."""
        return self._run(self.graphs.append, (*state, questions, skills, responses))

    def next(self, state, candidate_questions: np.ndarray, candidate_skills: np.ndarray) -> np.ndarray:
        return self._run(self.graphs.next, (*state, candidate_questions, candidate_skills))[0]


def appended_history(history: tuple[np.ndarray, ...], questions: np.ndarray, skills: np.ndarray,
                     responses: np.ndarray, drop: bool = True) -> tuple[np.ndarray, ...]:
    """The left-padded history [B, P] (skills [B, P, K]) after k more interactions per learner ([B, k]), its
    oldest k columns dropped (`drop`) or kept (skill sets widened to the larger K with PAD_ID)."""
    q, s, r = history
    k = questions.shape[1]
    width = max(s.shape[-1], skills.shape[-1])
    widen = lambda a: np.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, width - a.shape[-1])])   # noqa: E731 (PAD_ID 0)
    columns = ((q, questions), (widen(s), widen(skills)), (r, responses))
    return tuple(np.concatenate([kept[:, k:] if drop else kept, new], axis=1) for kept, new in columns)


def check_step_parity(model: KTModel, folder: Path, graphs: StepGraphs,
                      shapes: tuple[tuple[int, int], ...] = ((1, 1), (4, 16), (3, 7))) -> ParityReport:
    """Max |onnxruntime step_next - PyTorch per-candidate windows| over valid candidates: random histories
    of max_len - 1 columns (batch, candidates of `shapes`; learners of every kept length below the edge) after
    step_start, after one step_append of one interaction and after one of two; a band model also past its
    band (every learner's full history, W - 1 appended in one call, then one more)."""
    cfg = model.config
    model.eval()
    steps = StepSessions(folder, graphs)
    cases = []
    for i, (batch, candidates) in enumerate(shapes):
        arrays = rank_inputs(cfg.n_questions, cfg.n_skills, batch, cfg.max_len - 1, candidates, seed=i)
        history = [a.copy() for a in arrays[:3]]
        for array, pad in zip(history, (signature.PAD_ID, signature.PAD_ID, signature.PAD_RESPONSE)):
            array[:, :2] = pad                                   # every learner 2 below the edge: appends are exact
        state = steps.start(*history)
        one, two = _appended(model, batch, seed=100 + i), _appended(model, batch, seed=200 + i, k=2)
        checks = [(state, tuple(history)), (steps.append(state, *one), appended_history(tuple(history), *one)),
                  (steps.append(state, *two), appended_history(tuple(history), *two))]
        if cfg.band:
            full = arrays[:3]
            many, last = _appended(model, batch, seed=300 + i, k=cfg.max_len - 1), _appended(model, batch, seed=400 + i)
            after = steps.append(steps.start(*full), *many)
            longer = appended_history(full, *many, drop=False)
            checks += [(after, longer), (steps.append(after, *last), appended_history(longer, *last, drop=False))]
        valid = (arrays[4] != signature.PAD_ID).any(axis=-1)
        diff = 0.0
        for stepped, kept in checks:
            got = steps.next(stepped, *arrays[3:])
            ref = rank_reference(model, *kept, *arrays[3:])
            diff = max(diff, float(np.abs(got - ref)[valid].max()) if valid.any() else 0.0)
        cases.append((batch, cfg.max_len - 1, candidates, diff))
    return ParityReport(max_abs_diff=max(c[-1] for c in cases), cases=cases)
