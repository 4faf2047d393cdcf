"""Where a training process computes: `train.device` (auto | cpu | cuda) resolved to a torch device.

- auto: CUDA when this torch build sees a GPU, else CPU (this project's default install is the CPU
  build of torch, so auto is CPU unless a CUDA build is installed on a GPU host);
- rank r of a data-parallel run on CUDA uses GPU `local_rank` (one GPU per process, as torchrun
  expects) and the NCCL backend (training/distributed.py); on CPU, gloo.

Model code is device-agnostic: every tensor a forward pass creates is built on its inputs' device
(checked on PyTorch's `meta` device for every preset, tests/unit/test_training_device.py), batches
move to the model's device in the loop, and checkpoints are loaded onto the CPU (export and
serving never need a GPU). On CUDA training runs in float32: the bf16 autocast of train.bf16 is
CPU-only, so a GPU run computes what a CPU run computes, up to float rounding order.
"""
from __future__ import annotations

import torch

from routerkt.errors import UserError
from training.config import Device


def cuda_available() -> bool:
    return torch.cuda.is_available()


def resolve(kind: Device, local_rank: int = 0) -> torch.device:
    """The torch device of a training process (`local_rank`: its index among this host's processes)."""
    if kind is Device.CPU or (kind is Device.AUTO and not cuda_available()):
        return torch.device("cpu")
    if not cuda_available():
        raise UserError("train.device=cuda but torch sees no GPU (a CPU build of torch, or no visible device); "
                        "use train.device=auto or cpu")
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise UserError(f"training process {local_rank} needs GPU {local_rank} but this host shows {count}; "
                        f"start at most {count} processes per host with train.device=cuda")
    return torch.device("cuda", local_rank)
