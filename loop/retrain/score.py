"""Scoring a model version on the held-out events: AUC, log loss, Brier.

A published version is scored through its exported score graph (onnxruntime), the new model in PyTorch
on the same windows."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from loop.retrain.data import Split
from routerkt.contract.onnx_session import cpu_session
from routerkt.contract.signature import ONNX_FILE, PAD_ID, PAD_RESPONSE
from routerkt.contract.vocab import Vocab

EPS = 1e-7                # probabilities clipped as the gateway's outcome metrics clip them
BATCH_WINDOWS = 256


def windows(split: Split, window: int) -> list[tuple[int, int, int]]:
    """(first row, last row + 1, first scored row) of the windows that score every held-out row once.
    Held-out rows are scored in blocks of window // 2, each block at the end of a window of up to
    `window` rows, so every prediction sees at least half a window of the learner's earlier events
    (all of them when there are fewer): causal, and the same windows for every model."""
    stride = max(1, window // 2)
    out = []
    for start, held, end in split.segments():
        for block in range(held, end, stride):
            stop = min(block + stride, end)
            out.append((max(start, stop - window), stop, block))
    return out


def _encode(split: Split, vocab: Vocab, spans: list[tuple[int, int, int]], window: int, skill_rank: int):
    n, k = len(spans), split.skill_id.shape[1]
    questions = np.full((n, window), PAD_ID, dtype=np.int64)
    skills = np.full((n, window, k), PAD_ID, dtype=np.int64)
    responses = np.full((n, window), PAD_RESPONSE, dtype=np.int64)
    for i, (a, b, _) in enumerate(spans):
        length = b - a
        questions[i, window - length:] = vocab.encode_questions(split.question_id[a:b])
        skills[i, window - length:] = vocab.encode_skill_sets(split.skill_id[a:b])
        responses[i, window - length:] = split.correct[a:b]
    if skill_rank == 2:                       # a version exported before skill sets: each set's first skill
        skills = skills[:, :, 0]
    return questions, skills, responses


def predict(run, skill_rank: int, vocab: Vocab, window: int, split: Split) -> tuple[np.ndarray, np.ndarray]:
    """(labels, probabilities) of every held-out row, in row order; `run(questions, skills, responses)`
    returns P(correct) [batch, window] for one batch of windows."""
    spans = windows(split, window)
    labels, probs = [], []
    for begin in range(0, len(spans), BATCH_WINDOWS):
        part = spans[begin:begin + BATCH_WINDOWS]
        out = run(*_encode(split, vocab, part, window, skill_rank))
        for i, (a, b, scored) in enumerate(part):
            cols = np.arange(scored - a, b - a) + window - (b - a)
            labels.append(split.correct[scored:b])
            probs.append(out[i, cols])
    return np.concatenate(labels).astype(np.float64), np.concatenate(probs).astype(np.float64)


def metrics(labels: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    from training.metrics import auc
    p = np.clip(probs, EPS, 1 - EPS)
    return {"auc": auc(labels, p), "log_loss": float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p))),
            "brier": float(np.mean((probs - labels) ** 2)), "n": int(labels.size)}


def score_version(version_dir: Path, vocab: Vocab, window: int, split: Split) -> dict[str, float]:
    """Metrics of the published version in `version_dir`, through its exported score graph (model.onnx)."""
    session = cpu_session(Path(version_dir) / ONNX_FILE)
    skill_rank = len(next(i for i in session.get_inputs() if i.name == "skills").shape)

    def run(q, s, r):
        return session.run(None, {"questions": q, "skills": s, "responses": r})[0]
    return metrics(*predict(run, skill_rank, vocab, window, split))


def score_model(model, vocab: Vocab, window: int, split: Split) -> dict[str, float]:
    """Metrics of a trained PyTorch model on the same windows (export's parity check, <= 1e-5, makes its
    graph give the same: the new model is scored before it is exported, so a gated retrain exports nothing)."""
    import torch

    @torch.inference_mode()
    def run(q, s, r):
        model.eval()
        device = next(model.parameters()).device
        logits = model(*(torch.from_numpy(x).to(device) for x in (q, s, r))).logits
        return torch.sigmoid(logits.float()).cpu().numpy()
    return metrics(*predict(run, 3, vocab, window, split))
