"""Trace a trained model to ONNX with the shared signature, and check parity with PyTorch.

The model is rebuilt from a checkpoint's meta.json alone (training/checkpoint.py). Before tracing,
learner-independent biases are frozen into constants for the maximum window (ALiBi tables, the
relative recency kernel) and sliced to the actual length inside the graph; monotonic attention
keeps its data-dependent decay. Routed heads are served with the causal `prefix` scope only: a
model trained with the leaking whole-window `sequence` scope is refused.

Exporter: torch.onnx.export(dynamo=True), opset 18, dynamic batch and sequence axes, named tensors
from routerkt/contract/signature.py.
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
from training.models.base import KTModel

OPSET = 18
PARITY_TOL = 1e-5


class ExportError(UserError):
    """Export refused or failed (one line)."""


class InferenceModel(nn.Module):
    """The served function: (questions, skills, responses) [B, L] -> probs [B, L]."""

    def __init__(self, model: KTModel):
        super().__init__()
        self.model = model

    def forward(self, questions: Tensor, skills: Tensor, responses: Tensor) -> Tensor:
        return torch.sigmoid(self.model(questions, skills, responses).logits)


def check_servable(model: KTModel) -> None:
    cfg = model.config
    if cfg.leaks_future:
        raise ExportError("this model routes with the whole-window 'sequence' scope, which reads future "
                          "interactions; only causal scopes (prefix, token) can be served; retrain with "
                          "--set model.routing_scope=prefix")


def example_inputs(n_questions: int, n_skills: int, batch: int, length: int, seed: int = 0,
                   min_len: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random left-padded int64 batches with a random real length per row."""
    rng = np.random.default_rng(seed)
    q = rng.integers(signature.FIRST_ID, max(n_questions, signature.FIRST_ID + 1), (batch, length))
    s = rng.integers(signature.FIRST_ID, max(n_skills, signature.FIRST_ID + 1), (batch, length))
    r = rng.integers(0, 2, (batch, length))
    lengths = rng.integers(min(min_len, length), length + 1, batch)
    lengths[0] = length                                                    # one full row
    for b, n in enumerate(lengths):
        q[b, : length - n], s[b, : length - n], r[b, : length - n] = 0, 0, -1
    return q.astype(np.int64), s.astype(np.int64), r.astype(np.int64)


def export_onnx(model: KTModel, path: Path, quiet: bool = True) -> None:
    """Freeze biases and write `path` (single file, weights embedded)."""
    check_servable(model)
    model.eval()
    model.freeze_biases()
    wrapper = InferenceModel(model).eval()
    cfg = model.config
    L = min(cfg.max_len, 16)
    inputs = tuple(torch.from_numpy(a) for a in example_inputs(cfg.n_questions, cfg.n_skills, 2, L))
    batch = torch.export.Dim("batch", min=1, max=1 << 16)
    seq = torch.export.Dim("seq", min=2, max=cfg.max_len)
    dynamic = {name: {0: batch, 1: seq} for name in signature.SCORE.input_names}
    path = Path(path)
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
                    input_names=list(signature.SCORE.input_names), output_names=list(signature.SCORE.output_names),
                    dynamic_shapes=dynamic, verbose=False)
        except Exception as exc:  # the exporter raises many types; report one line, keep the cause
            raise ExportError(f"ONNX export failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}") from exc
    with atomic_path(path) as tmp:
        program.save(str(tmp))


@dataclass
class ParityReport:
    max_abs_diff: float
    cases: list[tuple[int, int, float]]   # (batch, length, max abs diff)

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= PARITY_TOL


def check_parity(model: KTModel, onnx_path: Path, batches: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None,
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
        valid = s != signature.PAD_ID
        diff = float(np.abs(got - ref)[valid].max()) if valid.any() else 0.0
        cases.append((q.shape[0], q.shape[1], diff))
    return ParityReport(max_abs_diff=max(c[2] for c in cases), cases=cases)
