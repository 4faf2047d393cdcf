"""Data-parallel training with torch.distributed, seen from inside one training process: its rank,
the process group, its shard of the global batch and the collectives (N processes, one model replica
each (DDP), one global batch of train.batch_size rows split across them). Starting the processes is
training/launch.py's job; nothing here imports the launcher, the run or the loop.

Backend: gloo on CPU, NCCL when train.device resolves to CUDA (training/device.py: rank r on GPU
`local_rank`, one GPU per process). The collectives below put their small tensors on that device
(NCCL takes no CPU tensors). Only the gloo path runs on this project's CPU machine.

Why the update equals the single-process one (same preset, seed and train.batch_size), up to float error:
- every rank draws the same global batch (same seed, same order) and trains on its contiguous slice
  of the rows (`shard`), so the steps per epoch and the learning rate are those of one process;
- one process minimises the MEAN over the batch's scored tokens. Averaging per-rank means would
  weigh a token by 1 / (world * tokens on its rank), wrong whenever shards hold different numbers
  of tokens (they nearly always do: learners differ in length). So a rank's loss is its SUM of token
  losses divided by the GLOBAL scored-token count (loop.batch_loss with `tokens`); its auxiliary
  terms (means over its own tokens: Rasch L2, load balance) are weighed by its share of the tokens.
  The ranks' losses then add up to the single-process loss; DDP all-reduces the gradients and
  divides by world, so each rank scales its loss by world (`Shard.grad_scale`): the averaged
  gradient is the gradient of the sum, the single-process gradient;
- the router's load-balance loss multiplies two batch statistics; its selection shares (no gradient)
  come from counts summed over the ranks (`global_sum` in models/router.py), so it matches too;
- after the all-reduce every rank holds the same gradient, so clipping and Adam agree everywhere;
- the same seed builds the same weights on every rank (DDP also broadcasts rank 0's). Dropout masks
  differ per rank and cannot match one process's (rank 0 keeps the single-process random stream).
Not exact: CL4KT's contrastive loss draws its negatives from the shard; a global batch with fewer
rows than processes gives the surplus ranks a stand-in row of weight 0, whose routing still enters
that step's selection counts.

Validation, early stopping, checkpoints, history, TensorBoard and metrics are rank 0's
(loop.train_fold, run.run_training): rank 0 evaluates and broadcasts its stop decision and which
folds are done; the other ranks only train.

Test hook: env ROUTERKT_TEST_DIE_AFTER_STEPS="R:N" makes rank R SIGKILL itself after its N-th
optimizer step (tests/integration/test_distributed_training.py); unset in normal use.
"""
from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from routerkt.errors import UserError
from training.batching import Batch

DIE_ENV = "ROUTERKT_TEST_DIE_AFTER_STEPS"


@dataclass(frozen=True)
class RankInfo:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


_CURRENT = RankInfo()
_DEVICE = torch.device("cpu")      # the device of the process group's collectives (process_group)
_steps_taken = 0


def current() -> RankInfo:
    """This process's rank in the data-parallel run in progress (rank 0 of 1 outside one)."""
    return _CURRENT


def from_env() -> RankInfo | None:
    """Rank info from torchrun's (or the launcher's) environment; None when not set."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    try:
        info = RankInfo(rank=int(os.environ["RANK"]), world=int(os.environ["WORLD_SIZE"]),
                        local_rank=int(os.environ.get("LOCAL_RANK", os.environ["RANK"])))
    except ValueError:
        raise UserError("RANK / WORLD_SIZE / LOCAL_RANK must be integers") from None
    if not 0 <= info.rank < info.world:
        raise UserError(f"RANK {info.rank} is not in [0, WORLD_SIZE={info.world})")
    return info


def backend(device: torch.device | None = None) -> str:
    """The process-group backend for tensors on `device`: NCCL for CUDA, gloo otherwise."""
    return "nccl" if device is not None and device.type == "cuda" else "gloo"


@contextmanager
def process_group(info: RankInfo, device: torch.device = torch.device("cpu")) -> Iterator[RankInfo]:
    """Join the process group of `info` (env:// rendezvous) for the block, with the backend for
    `device` (the rank's training device); a no-op for one process."""
    global _CURRENT, _DEVICE
    if info.distributed:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        try:
            dist.init_process_group(backend(device), rank=info.rank, world_size=info.world,
                                    timeout=timedelta(minutes=30))
        except (RuntimeError, ValueError) as exc:
            raise UserError(f"training process {info.rank}: cannot join the process group "
                            f"({str(exc).splitlines()[0][:160]})") from None
    _CURRENT, _DEVICE = info, device
    try:
        yield info
        if info.distributed:
            dist.barrier()              # rank 0 finishes its test evaluation and metrics before anyone leaves
    finally:
        _CURRENT, _DEVICE = RankInfo(), torch.device("cpu")
        if dist.is_initialized():
            dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------
# training-step helpers (all of them are identities for one process)

@dataclass
class Shard:
    batch: Batch            # this rank's rows of the global batch (the whole batch for one process)
    tokens: int | None      # scored tokens of the GLOBAL batch; None for one process (plain mean loss)
    share: float            # this rank's fraction of those tokens (0 for a stand-in row)
    grad_scale: float       # multiplies the loss before backward: world (DDP divides the sum by it), 0 for a stand-in
    rows: int               # rows of the global batch (what the epoch's statistics count)


def shard(batch: Batch, info: RankInfo | None = None) -> Shard:
    """This rank's contiguous slice of the global batch's rows, with the weights that make the ranks'
    losses add up to the global mean (module docstring). The batch's width is kept as is."""
    info = info or _CURRENT
    if not info.distributed:
        return Shard(batch=batch, tokens=None, share=1.0, grad_scale=1.0, rows=batch.size)
    rows = np.array_split(np.arange(batch.size), info.world)[info.rank]
    stand_in = len(rows) == 0
    if stand_in:                       # fewer rows than processes: compute on row 0, contribute nothing
        rows = np.arange(1)
    part = Batch(questions=batch.questions[rows], skills=batch.skills[rows], responses=batch.responses[rows],
                 index=batch.index[rows])
    tokens = int((batch.responses >= 0).sum())
    mine = int((part.responses >= 0).sum())
    share = 0.0 if stand_in else mine / max(tokens, 1)
    return Shard(batch=part, tokens=max(tokens, 1), share=share, grad_scale=0.0 if stand_in else float(info.world),
                 rows=batch.size)


def wrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module to train: DDP around `model` in a data-parallel run, `model` itself otherwise.
    Evaluate and save `model` (never the wrapper: its forward takes part in collectives)."""
    if not _CURRENT.distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel
    ids = [_DEVICE.index] if _DEVICE.type == "cuda" else None
    # the models' buffers are constants (no batch norm): synced once at init, not before every forward
    return DistributedDataParallel(model, device_ids=ids, forward_sync_buffers=False)


def seed_rank(seed: int) -> None:
    """After the (identical) model init: a separate random stream per rank for dropout and augmentations;
    rank 0 keeps the single-process stream."""
    if _CURRENT.rank > 0:
        torch.manual_seed(seed + 1_000_003 * _CURRENT.rank)


def global_sum(t: Tensor) -> Tensor:
    """Sum of `t` over the ranks (a detached copy); `t` itself for one process. Every rank must call it."""
    if not _CURRENT.distributed:
        return t
    t = t.detach().to(_DEVICE, copy=True)
    dist.all_reduce(t)
    return t


def sum_over_ranks(values: dict[str, float]) -> dict[str, float]:
    """Per-key sums of the ranks' dicts (the same keys on every rank)."""
    if not _CURRENT.distributed or not values:
        return values
    keys = sorted(values)
    total = global_sum(torch.tensor([values[k] for k in keys], dtype=torch.float64))
    return dict(zip(keys, total.cpu().tolist()))


def broadcast_flag(flag: bool) -> bool:
    """Rank 0's `flag` on every rank (decisions: stop early, fold already done)."""
    if not _CURRENT.distributed:
        return flag
    t = torch.tensor([int(flag)], dtype=torch.int64, device=_DEVICE)
    dist.broadcast(t, src=0)
    return bool(t.item())


def step_hook() -> None:
    """Called after every optimizer step; only acts under the test hook (module docstring)."""
    global _steps_taken
    _steps_taken += 1
    spec = os.environ.get(DIE_ENV)
    if spec:
        rank, steps = (int(x) for x in spec.split(":"))
        if rank == _CURRENT.rank and _steps_taken >= steps:
            os.kill(os.getpid(), signal.SIGKILL)


def peer_failure(exc: BaseException) -> bool:
    """Whether `exc` is a collective failing because another process went away."""
    text = str(exc).lower()
    return isinstance(exc, dist.DistError) or (isinstance(exc, RuntimeError) and any(
        s in text for s in ("gloo", "connection closed", "connection reset", "broken pipe")))
