"""The explain graph (routerkt/contract/signature.py EXPLAIN): export beside the rank graph, and its parity check."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from export.onnx_export import (ParityReport, candidate_windows, export_rank_inputs_graph, rank_inputs,
                                rank_reference)
from routerkt.contract import signature
from routerkt.contract.onnx_session import cpu_session
from training.models.attention import MultiHeadAttention
from training.models.kt_model import KTModel
from training.models.explain_forward import explain_rank, explained_layer


class ExplainInferenceModel(nn.Module):
    """history [B, H], candidates [B, N] (skills [.., K]) -> candidate_probs [B, N], explain_attention
    [B, N, heads, H], explain_head_weights [B, N, heads]."""

    def __init__(self, model: KTModel):
        super().__init__()
        self.model = model

    def forward(self, history_questions: Tensor, history_skills: Tensor, history_responses: Tensor,
                candidate_questions: Tensor, candidate_skills: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        out = explain_rank(self.model, history_questions, history_skills, history_responses,
                           candidate_questions, candidate_skills)
        return torch.sigmoid(out.logits), out.attention, out.head_weights


def explainable(model: KTModel) -> bool:
    """True when the model has attention layers to explain (not DKT)."""
    return any(isinstance(m, MultiHeadAttention) for m in model.modules())


def export_explain_onnx(model: KTModel, path: Path, quiet: bool = True) -> None:
    """Freeze biases and write the explain graph to `path` (axes as the rank graph's, heads fixed)."""
    export_rank_inputs_graph(ExplainInferenceModel(model), signature.EXPLAIN, path, quiet)


def window_attention(model: KTModel, *rank_arrays: np.ndarray) -> np.ndarray:
    """The reference: [B, N, heads, H] attention of the explained layer at the candidate's slot of
    its own window [history_b, candidate_j] (PyTorch forward with return_attention), over the history;
    `rank_arrays`: the rank graph's five inputs (export/onnx_export.py, `candidate_windows`)."""
    q, s, r = (torch.from_numpy(a) for a in candidate_windows(*rank_arrays))
    with torch.no_grad():
        out = model(q, s, r, return_attention=True)
    probs = out.attention[explained_layer(out.attention_names)]                  # [B*N, heads, L, L]
    rows = probs[:, :, -1, :-1].numpy()                                          # [B*N, heads, H]
    return rows.reshape(*rank_arrays[3].shape, *rows.shape[1:])


def check_explain_parity(model: KTModel, onnx_path: Path, batches: list[tuple[np.ndarray, ...]] | None = None,
                         session=None) -> ParityReport:
    """Max |onnxruntime explain graph - PyTorch| over valid candidates: probabilities against
    per-candidate windows, attention against each window's explained layer, head weights against
    the PyTorch explain forward; random inputs at history window - 1 (1 and 16 candidates) and short."""
    cfg = model.config
    model.eval()
    sess = session or cpu_session(onnx_path)
    H = cfg.max_len - 1
    cases_in = [rank_inputs(cfg.n_questions, cfg.n_skills, b, min(h, H), n, seed=i)
                for i, (b, h, n) in enumerate(((1, H, 1), (3, H, 16), (3, min(H, 5), 7)))] + list(batches or [])
    cases = []
    for arrays in cases_in:
        feeds = dict(zip(signature.EXPLAIN.input_names, arrays))
        probs, attention, weights = sess.run(list(signature.EXPLAIN.output_names), feeds)
        with torch.no_grad():
            ref = explain_rank(model, *(torch.from_numpy(a) for a in arrays))
        valid = (arrays[4] != signature.PAD_ID).any(axis=-1)                     # [B, N]
        diffs = [np.abs(probs - rank_reference(model, *arrays))[valid],
                 np.abs(attention - window_attention(model, *arrays))[valid],
                 np.abs(weights - ref.head_weights.numpy())[valid]]
        diff = max(float(d.max()) if d.size else 0.0 for d in diffs)
        cases.append((*arrays[1].shape[:2], arrays[4].shape[1], diff))
    return ParityReport(max_abs_diff=max(c[-1] for c in cases), cases=cases)
