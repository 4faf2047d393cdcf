"""training/device.py and the device handling of the loop: model code is device-agnostic (every
preset's training step runs on PyTorch's `meta` device, which refuses any CPU tensor a forward or
backward would mix in), train.device resolves as documented, NCCL goes with CUDA."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from routerkt.errors import UserError
from training import device as devices
from training.batching import Batch
from training.config import Device
from training.distributed import backend
from training.fold_training import autocast, model_device
from training.models.registry import PRESETS, build_model, preset_config, with_vocab

pytestmark = pytest.mark.unit


def _batch(rows: int = 3, length: int = 12) -> Batch:
    g = torch.Generator().manual_seed(0)
    responses = torch.randint(0, 2, (rows, length), generator=g)
    responses[0, :4] = -1                                      # left padding in one row
    return Batch(questions=torch.randint(1, 40, (rows, length), generator=g),
                 skills=torch.randint(1, 8, (rows, length, 1), generator=g), responses=responses,
                 index=np.arange(rows))


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_training_step_stays_on_the_models_device(preset):
    cfg = with_vocab(preset_config(preset), 40, 8)
    cfg.max_len = 12
    model = build_model(cfg).to("meta").train()
    batch = _batch().to(model_device(model))                  # what batch_loss does with a CPU batch
    out = model(batch.questions, batch.skills, batch.responses)
    # the loss without batch_loss's mask indexing (data-dependent shapes have no meta kernel)
    loss = (out.logits * (batch.responses >= 0)).sum() + out.aux_loss
    assert loss.device.type == "meta"
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is None or g.device.type == "meta" for g in grads)
    assert any(g is not None for g in grads)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_an_exported_model_moves_whole_to_another_device(preset):
    """After freeze_biases (what export does) every precomputed table follows `.to(device)`: the
    relative recency tables once stayed on the CPU and a CUDA forward failed (seen on an H200)."""
    cfg = with_vocab(preset_config(preset), 40, 8)
    cfg.max_len = 12
    model = build_model(cfg).eval()
    model.freeze_biases()
    model = model.to("meta")
    assert all(t.device.type == "meta" for t in [*model.parameters(), *model.buffers()])
    batch = _batch().to(torch.device("meta"))
    with torch.no_grad():
        assert model(batch.questions, batch.skills, batch.responses).logits.device.type == "meta"


def test_batch_loss_moves_a_batch_to_the_models_device(monkeypatch):
    import training.fold_training as loop
    seen = []
    original = Batch.to
    monkeypatch.setattr(Batch, "to", lambda self, device: seen.append(device) or original(self, device))
    model = build_model(with_vocab(preset_config("akt-standard"), 40, 8))
    loss, _ = loop.batch_loss(model, _batch())
    assert seen == [torch.device("cpu")] and loss.requires_grad


def test_batch_to_moves_the_tensors_and_keeps_the_rows():
    batch = _batch()
    assert batch.to(torch.device("cpu")) is batch
    moved = batch.to(torch.device("meta"))
    assert moved.questions.device.type == moved.responses.device.type == "meta"
    assert moved.index is batch.index and moved.size == batch.size


def test_auto_is_the_cpu_without_a_gpu(monkeypatch):
    monkeypatch.setattr(devices, "cuda_available", lambda: False)
    assert devices.resolve(Device.AUTO) == torch.device("cpu")
    assert devices.resolve(Device.CPU, local_rank=3) == torch.device("cpu")
    with pytest.raises(UserError, match="train.device=cuda but torch sees no GPU"):
        devices.resolve(Device.CUDA)


def test_cuda_gives_each_local_rank_its_own_gpu(monkeypatch):
    monkeypatch.setattr(devices, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert devices.resolve(Device.AUTO, local_rank=1) == torch.device("cuda", 1)
    assert devices.resolve(Device.CUDA, local_rank=0) == torch.device("cuda", 0)
    assert devices.resolve(Device.CPU, local_rank=1) == torch.device("cpu")
    with pytest.raises(UserError, match="needs GPU 2 but this host shows 2"):
        devices.resolve(Device.CUDA, local_rank=2)


def test_nccl_for_cuda_gloo_otherwise():
    assert backend(torch.device("cuda", 0)) == "nccl"
    assert backend(torch.device("cpu")) == backend(None) == "gloo"


def test_bf16_autocast_is_never_used_off_the_cpu(monkeypatch):
    import training.fold_training as loop
    monkeypatch.setattr(loop, "bf16_available", lambda: True)
    assert isinstance(autocast(True, torch.device("cpu")), torch.autocast)
    assert not isinstance(autocast(True, torch.device("cuda", 0)), torch.autocast)
    assert not isinstance(autocast(False, torch.device("cpu")), torch.autocast)
    assert loop.bf16_used(True, torch.device("cpu")) and not loop.bf16_used(True, torch.device("cuda", 0))
    monkeypatch.setattr(loop, "bf16_available", lambda: False)           # a CPU without bf16 kernels
    assert not loop.bf16_used(True, torch.device("cpu"))
    assert not isinstance(autocast(True, torch.device("cpu")), torch.autocast)
