"""Communication facade: the only module in zerotrain that imports torch.distributed.

Everything else receives a `Comm` and calls it the same way with world size 1 (where every
collective is a no-op) and N (gloo on CPU, NCCL on CUDA, launched by torchrun). Keeping the
calls here lets a test forbid `torch.distributed` anywhere else.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import functools
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import ConfigError, DistributedFaultError
from .heartbeat import Heartbeat

# torch 2.13 renamed the flat-tensor collectives; older releases only have the old names.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class _Batch:
    """Several async handles that make one collective; `then` runs once all of them are done."""

    def __init__(self, works: list, then=None):
        self.works, self.then = works, then

    def wait(self) -> bool:
        for work in self.works:
            work.wait()
        if self.then is not None:
            self.then()
            self.then = None
        return True

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self.works)


# gloo's flat all-gather and reduce-scatter stage the whole tensor through a temporary on the
# calling thread (all-gather: a copy of `out`; reduce-scatter: a clone of `inp`). On CPU those
# temporaries land in the heap between the activations and fragment it: at ZeRO-3 the heap of
# a 20M-parameter GPT grew by ~200 MB over 8 steps with the same live bytes, and at stages 1-2
# the gather of the updated parameters copied the whole model through one every step. The
# same traffic as one broadcast / reduce per rank, each in place, needs no temporary.
def _gloo_all_gather(out: torch.Tensor, inp: torch.Tensor, group, async_op: bool):
    ws, rank = dist.get_world_size(group), dist.get_rank(group)
    chunks = out.view(ws, -1)
    if chunks[rank].data_ptr() != inp.data_ptr():
        chunks[rank].copy_(inp)
    works = [dist.broadcast(chunks[r], group=group, group_src=r, async_op=True) for r in range(ws)]
    batch = _Batch(works)
    return batch if async_op else batch.wait()


def _gloo_reduce_scatter(out: torch.Tensor, inp: torch.Tensor, group, async_op: bool):
    """`inp` is left as scratch, as after a reduce."""
    ws, rank = dist.get_world_size(group), dist.get_rank(group)
    chunks = inp.view(ws, -1)
    works = [dist.reduce(chunks[r], group=group, group_dst=r, async_op=True) for r in range(ws)]

    def keep_mine() -> None:
        if out.data_ptr() != chunks[rank].data_ptr():
            out.copy_(chunks[rank])

    batch = _Batch(works, then=keep_mine)
    return batch if async_op else batch.wait()


_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}

# One per process, started when it joins a world: the collectives counter lives in it, so every
# Comm of the process counts into the same sequence (the one every rank walks through).
_heartbeat: Heartbeat | None = None
_timeout_s: float | None = None
# The backend gets ddp_timeout minus the time naming the culprit takes, so the error line
# still comes within ddp_timeout.
_DIAGNOSIS_S = 1.5


@dataclass(frozen=True)
class ParallelState:
    """Where this process sits in the job: rank, world size and the device it computes on."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: str | None = None
    local_world_size: int = 0  # ranks on this node (torchrun's LOCAL_WORLD_SIZE); 0: all of them

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def node(self) -> int:
        """This rank's node: torchrun numbers ranks node by node, local_world_size to a node."""
        return self.rank // (self.local_world_size or self.world_size)


class _DoneWork:
    """Stands in for an async handle when nothing was sent (world size 1)."""

    def wait(self) -> bool:
        return True

    def is_completed(self) -> bool:
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
                backend_s = timeout_s - _DIAGNOSIS_S if timeout_s > 2 * _DIAGNOSIS_S else timeout_s
                kwargs["timeout"] = datetime.timedelta(seconds=backend_s)
            dist.init_process_group(backend=backend, rank=rank, world_size=world, **kwargs)
    _start_heartbeat(rank, world, timeout_s)
    local_rank = _env_int("LOCAL_RANK", rank)
    if torch.cuda.is_available() and backend in (None, "nccl"):
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return ParallelState(rank=rank, world_size=world, local_rank=local_rank, device=device,
                         backend=backend, local_world_size=_env_int("LOCAL_WORLD_SIZE", 0))


def ensure_process_group() -> None:
    """A one-process pipeline still needs a process group for torch's stages."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def _start_heartbeat(rank: int, world: int, timeout_s: float | None) -> None:
    global _heartbeat, _timeout_s
    if timeout_s is not None:
        _timeout_s = timeout_s
    if world == 1 or (_heartbeat is not None and _heartbeat.alive):
        return
    try:
        store = dist.distributed_c10d._get_default_store()
    except (RuntimeError, AttributeError):  # a group without a store: faults go unnamed
        return
    _heartbeat = Heartbeat(store, rank, world).start()
    atexit.register(_heartbeat.stop)  # not mid-call into the store while the process tears down


def shutdown() -> None:
    """Leave the process group before exiting early (a rank that stops on a user error):
    exiting with a live gloo group makes its threads abort the process noisily."""
    global _heartbeat
    if _heartbeat is not None:
        _heartbeat.stop()
        _heartbeat = None
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _fault(rank: int, what: str, error: Exception, members: tuple[int, ...] | None = None) -> DistributedFaultError:
    """The backend's error turned into one line that names the culprit rank(s)."""
    cause = " ".join(str(error).split())[:160] or type(error).__name__
    waited = f" (ddp_timeout {_timeout_s:g} s)" if _timeout_s is not None else ""
    if _heartbeat is None:
        return DistributedFaultError(f"rank {rank}: {what} failed{waited}: {cause}", [])
    ranks, why = _heartbeat.diagnose(members)
    count = _heartbeat.collectives if members is None else _heartbeat.group_calls.get(members, 0)
    where = "" if members is None else f" of group {list(members)}"
    head = f"rank {rank}: {what} (collective {count}{where}) failed{waited}"
    return DistributedFaultError(f"{head}: {why or 'no other rank looks dead or hung'}; backend said: {cause}", ranks)


def _entered(members: tuple[int, ...] | None = None) -> None:
    if _heartbeat is not None:
        _heartbeat.count(members)


class _Watched:
    """An async handle whose wait() turns a backend failure into a DistributedFaultError."""

    def __init__(self, work, rank: int, what: str, members: tuple[int, ...] | None = None):
        self.work, self.rank, self.what, self.members = work, rank, what, members

    def wait(self):
        try:
            return self.work.wait()
        except RuntimeError as e:
            raise _fault(self.rank, self.what, e, self.members) from None

    def is_completed(self) -> bool:
        return self.work.is_completed()


class Comm:
    """Collectives over the data-parallel group; each is a no-op when world size is 1.

    `rank` and `world_size` are this process's place in the group: `state` says them (for a
    subgroup, build it with `Comm.subgroup`, which reads them from the group). Ranks passed to
    reduce/broadcast are group ranks."""

    def __init__(self, state: ParallelState, group=None, global_rank: int | None = None):
        self.state = state
        self.group = group
        self.global_rank = state.rank if global_rank is None else global_rank
        # a subgroup's collectives are counted apart: its members enter it a different number
        # of times than ranks outside it do (heartbeat.py compares counts of one group only)
        self.members = None if group is None else tuple(dist.get_process_group_ranks(group))
        if self.members is not None and len(self.members) == dist.get_world_size():
            self.members = None

    @classmethod
    def subgroup(cls, state: ParallelState, group) -> Comm:
        """A Comm over `group` (every member must hold it), with the group's rank and size;
        None (a one-rank dimension) gives a Comm that is alone."""
        if group is None:
            return cls(dataclasses.replace(state, rank=0, world_size=1), None, global_rank=state.rank)
        local = dataclasses.replace(state, rank=dist.get_rank(group), world_size=dist.get_world_size(group))
        return cls(local, group, global_rank=state.rank)

    @property
    def rank(self) -> int:
        return self.state.rank

    @property
    def world_size(self) -> int:
        return self.state.world_size

    @property
    def alone(self) -> bool:
        return self.state.world_size == 1

    def _call(self, what: str, fn, *args, async_op: bool = False, **kwargs):
        _entered(self.members)
        try:
            work = fn(*args, group=self.group, async_op=async_op, **kwargs)
        except RuntimeError as e:
            raise _fault(self.global_rank, what, e, self.members) from None
        return _Watched(work, self.global_rank, what, self.members) if async_op else None

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", async_op: bool = False):
        if self.alone:
            return _DoneWork() if async_op else None
        return self._call("all_reduce", dist.all_reduce, tensor, op=_OPS[op], async_op=async_op)

    def reduce(self, tensor: torch.Tensor, dst: int, async_op: bool = False):
        """Sum `tensor` across ranks into rank `dst` (elsewhere it is left as scratch)."""
        if self.alone:
            return _DoneWork() if async_op else None
        return self._call("reduce", dist.reduce, tensor, group_dst=dst, async_op=async_op)

    @functools.cached_property
    def _gloo(self) -> bool:
        return dist.get_backend(self.group) == "gloo"

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, async_op: bool = False):
        """Sum `inp` (world_size equal chunks, contiguous) across ranks; this rank keeps its chunk
        in `out`. `inp` may be left as scratch."""
        if self.alone:
            out.copy_(inp)
            return _DoneWork() if async_op else None
        fn = _gloo_reduce_scatter if self._gloo else _reduce_scatter_flat
        return self._call("reduce_scatter", fn, out, inp, async_op=async_op)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, async_op: bool = False):
        """Concatenate every rank's `inp` into `out` (rank order; contiguous). `inp` may be this
        rank's own chunk of `out`."""
        if self.alone:
            if out.data_ptr() != inp.data_ptr():
                out.copy_(inp)
            return _DoneWork() if async_op else None
        fn = _gloo_all_gather if self._gloo else _all_gather_flat
        return self._call("all_gather", fn, out, inp, async_op=async_op)

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        """Chunk i of `inp` (world_size equal chunks along dim 0, contiguous) goes to rank i;
        chunk i of `out` is what rank i sent here (sequence parallelism's head/sequence swap)."""
        if self.alone:
            out.copy_(inp)
            return
        self._call("all_to_all", dist.all_to_all_single, out, inp)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        if not self.alone:
            self._call("broadcast", dist.broadcast, tensor, group_src=src)

    def all_gather_object(self, obj) -> list:
        if self.alone:
            return [obj]
        out = [None] * self.world_size
        self._call("all_gather_object", lambda group, async_op: dist.all_gather_object(out, obj, group=group))
        return out

    def barrier(self) -> None:
        if not self.alone:
            self._call("barrier", dist.barrier)
