"""Shared fixtures for the e2e tests: a tiny signature-conforming ONNX model (no project models).

- `tiny_kt_model`: a small torch module (embeddings + causal cumulative mean) and its vocabulary
  sizes; `tiny_kt_onnx`: that module exported with the dynamo exporter (opset 18, dynamic batch and
  seq axes, tensor names from routerkt/contract/signature.py). Both are built once per test session.
"""
from __future__ import annotations

import contextlib
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from routerkt.contract import signature

TINY_N_QUESTIONS = 50
TINY_N_SKILLS = 12


def _build_module():
    import torch
    from torch import nn

    class TinyKT(nn.Module):
        """P(correct at t) from questions <= t and responses < t (causal cumulative mean)."""

        def __init__(self, n_questions: int, n_skills: int, dim: int = 8) -> None:
            super().__init__()
            self.question = nn.Embedding(n_questions, dim)
            self.skill = nn.Embedding(n_skills, dim)
            self.response = nn.Embedding(3, dim)        # responses -1/0/1 -> rows 0/1/2

        def forward(self, questions, skills, responses):  # int64 [B, L], skill sets [B, L, K], [B, L]
            target = self.question(questions) + self.skill(skills).mean(-2)        # [B, L, d]
            past = self.response(responses.clamp(-1, 1) + 1) + target             # [B, L, d]
            summed = torch.cumsum(past, dim=1) - past                              # strictly past
            steps = torch.arange(questions.shape[1], device=questions.device)     # [L]
            count = steps.clamp(min=1).to(target.dtype).view(1, -1, 1)            # [1, L, 1]
            history = summed / count                                               # [B, L, d]
            return torch.sigmoid((history * target).sum(-1) + 0.1)                 # [B, L]

    torch.manual_seed(0)
    return TinyKT(TINY_N_QUESTIONS, TINY_N_SKILLS).eval()


@dataclass
class TinyModel:
    module: object            # torch.nn.Module
    n_questions: int
    n_skills: int
    onnx_path: Path | None = None


@pytest.fixture(scope="session")
def tiny_kt_model() -> TinyModel:
    pytest.importorskip("torch")
    return TinyModel(_build_module(), TINY_N_QUESTIONS, TINY_N_SKILLS)


@pytest.fixture(scope="session")
def tiny_kt_onnx(tiny_kt_model: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """`tiny_kt_model` with `onnx_path` set to its exported model.onnx."""
    import torch

    path = tmp_path_factory.mktemp("tiny_onnx") / signature.ONNX_FILE
    example = tuple(torch.zeros(2, 10, *((2,) if signature.skill_axis(spec) else ()), dtype=torch.int64)
                    for spec in signature.SCORE.inputs)
    batch = torch.export.Dim("batch", min=1, max=4096)
    seq = torch.export.Dim("seq", min=2, max=512)
    skills = torch.export.Dim("skills", min=1, max=64)
    with warnings.catch_warnings():            # exporter chatter (torchvision, LeafSpec, axis names)
        warnings.simplefilter("ignore")
        torch.onnx.export(
            tiny_kt_model.module, example, str(path), dynamo=True, opset_version=18,
            input_names=list(signature.SCORE.input_names), output_names=list(signature.SCORE.output_names),
            dynamic_shapes={spec.name: {0: batch, 1: seq, **({2: skills} if signature.skill_axis(spec) else {})}
                            for spec in signature.SCORE.inputs},
            external_data=False, verbose=False)
    tiny_kt_model.onnx_path = path
    return tiny_kt_model


@contextlib.contextmanager
def triton_over(repository: Path, log_dir: Path):
    """A started tritonserver over `repository` (its log in log_dir/triton.log), stopped on exit."""
    from serving.tritonserver.launcher import TritonServer
    server = TritonServer(repository, log_path=log_dir / "triton.log", exit_timeout_s=3)
    server.start(timeout=120)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def triton(kt_repository, tmp_path_factory):
    """A tritonserver over the tiny exported routerkt-akt (tests/conftest.py), one per test module."""
    with triton_over(kt_repository.path, tmp_path_factory.mktemp("triton")) as server:
        yield server


@contextlib.contextmanager
def gateway_over(repository: Path, triton_url: str, store: Path | None = None, secret: bytes = b"e2e-secret-" * 3,
                 versions: tuple[int, ...] = (0,)):
    """An in-process gateway over a running Triton (with a SQLite session store at `store` if given),
    yielded as (gateway, stub) once each of `versions` of model "kt" answers a Predict (0: the latest)."""
    import grpc

    from serving.api import knowledge_tracing_pb2 as pb
    from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
    from serving.core.catalog import ModelCatalog
    from serving.metrics import Metrics
    from serving.server import ThreadedGateway
    from serving.sessions.factory import open_store
    from serving.sessions.keys import LearnerKeys
    from serving.settings import Settings

    settings = Settings(repository=repository, triton_url=triton_url, grpc_port=0, http_port=0,
                        probe_interval_s=0.5, probe_timeout_s=10.0, grace_period_s=1.0)
    metrics, catalog = Metrics(), ModelCatalog(repository)
    parts = {} if store is None else {"store": open_store(f"sqlite:///{store}"), "keys": LearnerKeys(secret)}
    gw = ThreadedGateway(settings, metrics, catalog=catalog, **parts).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}")
    stub = pb_grpc.KnowledgeTracingServiceStub(channel)
    try:
        for version in versions:
            for _ in range(240):
                try:
                    stub.Predict(pb.PredictRequest(model="kt", version=version,
                                                   candidates=[pb.Candidate(question_id=1)]), timeout=5)
                    break
                except grpc.RpcError:
                    time.sleep(0.25)
        yield gw, stub
    finally:
        channel.close()
        gw.stop(grace=1.0)


@pytest.fixture(scope="module")
def stored_gateway(kt_repository, triton, tmp_path_factory):
    """`gateway_over` the module's `triton` with a SQLite session store of its own: (gateway, stub)."""
    store = tmp_path_factory.mktemp("sessions") / "sessions.sqlite3"
    with gateway_over(kt_repository.path, triton.grpc_url, store) as served:
        yield served


@pytest.fixture(scope="module")
def checkpoint(kt_repository):
    """The PyTorch checkpoint behind the tiny exported routerkt-akt (the reference of e2e tests; a
    module may define its own)."""
    from training.checkpoint import load_checkpoint
    from training.training_run import best_fold_dir
    return load_checkpoint(best_fold_dir(kt_repository.run))
