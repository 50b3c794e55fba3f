"""Communication facade: the only module in zerotrain that imports torch.distributed.

Everything else receives a `Comm` and calls it the same way with world size 1 (where every
collective is a no-op) and N (gloo on CPU, NCCL on CUDA, launched by torchrun). Keeping the
calls here lets a test forbid `torch.distributed` anywhere else.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import ConfigError

# torch 2.13 renamed the flat-tensor collectives; older releases only have the old names.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


@dataclass(frozen=True)
class ParallelState:
    """Where this process sits in the job: rank, world size and the device it computes on."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


class _DoneWork:
    """Stands in for an async handle when nothing was sent (world size 1)."""

    def wait(self) -> bool:
        return True


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} is not an integer") from None


def init_parallel(timeout_s: float | None = None) -> ParallelState:
    """Join the process group torchrun describes in the environment, or run alone.

    An already initialised default group (a test harness, a user script) is reused as is.
    """
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        backend = dist.get_backend()
    else:
        world = _env_int("WORLD_SIZE", 1)
        rank = _env_int("RANK", 0)
        backend = None
        if world > 1:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            kwargs = {}
            if timeout_s is not None:
                kwargs["timeout"] = datetime.timedelta(seconds=timeout_s)
            dist.init_process_group(backend=backend, rank=rank, world_size=world, **kwargs)
    local_rank = _env_int("LOCAL_RANK", rank)
    if torch.cuda.is_available() and backend in (None, "nccl"):
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return ParallelState(rank=rank, world_size=world, local_rank=local_rank, device=device,
                         backend=backend)


def shutdown() -> None:
    """Leave the process group before exiting early (a rank that stops on a user error):
    exiting with a live gloo group makes its threads abort the process noisily."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


class Comm:
    """Collectives over the data-parallel group; each is a no-op when world size is 1."""

    def __init__(self, state: ParallelState, group=None):
        self.state = state
        self.group = group

    @property
    def rank(self) -> int:
        return self.state.rank

    @property
    def world_size(self) -> int:
        return self.state.world_size

    @property
    def alone(self) -> bool:
        return self.state.world_size == 1

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", async_op: bool = False):
        if self.alone:
            return _DoneWork() if async_op else None
        return dist.all_reduce(tensor, op=_OPS[op], group=self.group, async_op=async_op)

    def reduce(self, tensor: torch.Tensor, dst: int, async_op: bool = False):
        """Sum `tensor` across ranks into rank `dst` (elsewhere it is left as scratch)."""
        if self.alone:
            return _DoneWork() if async_op else None
        return dist.reduce(tensor, dst=dst, group=self.group, async_op=async_op)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, async_op: bool = False):
        """Sum `inp` (world_size equal chunks) across ranks; this rank keeps its chunk in `out`."""
        if self.alone:
            out.copy_(inp)
            return _DoneWork() if async_op else None
        return _reduce_scatter_flat(out, inp, group=self.group, async_op=async_op)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, async_op: bool = False):
        """Concatenate every rank's `inp` into `out` (rank order)."""
        if self.alone:
            out.copy_(inp)
            return _DoneWork() if async_op else None
        return _all_gather_flat(out, inp, group=self.group, async_op=async_op)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        if not self.alone:
            dist.broadcast(tensor, src=src, group=self.group)

    def all_gather_object(self, obj) -> list:
        if self.alone:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def barrier(self) -> None:
        if not self.alone:
            dist.barrier(group=self.group)
