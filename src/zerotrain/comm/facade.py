"""DeepSpeed's `deepspeed.comm` calls as `zerotrain.comm.<name>`: torch.distributed's names and
arguments, for scripts (`import zerotrain.comm as dist`).

    zerotrain.init_distributed()           # the backend from the accelerator, the world from env
    dist.all_reduce(t, op=dist.ReduceOp.SUM); dist.barrier(); dist.log_summary()

Without a process group every call answers for a world of one (rank 0, world size 1, the
collectives copy or keep their input), so a script runs unchanged in one plain process. Calls
go through Comm's error handling: a dead or hung rank is named (collectives.py). log_summary
prints what the script sent through these calls (the engine's own traffic is not counted).
"""

from __future__ import annotations

import datetime
import logging
import os
from collections import defaultdict

import torch
import torch.distributed as dist

from .collectives import Comm, ParallelState, _DoneWork, init_parallel

ReduceOp = dist.ReduceOp
log = logging.getLogger("zerotrain")
_sent: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # op -> [calls, bytes]


def is_available() -> bool:
    return dist.is_available()


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def init_distributed(dist_backend: str | None = None, auto_mpi_discovery: bool = True, distributed_port: int = 29500,
                     verbose: bool = True, timeout: datetime.timedelta | None = None, init_method: str | None = None,
                     dist_init_required: bool | None = None, config=None, rank: int = -1, world_size: int = -1) -> None:
    """Join the world torchrun (or `zerotrain launch`) describes in RANK, WORLD_SIZE, MASTER_ADDR
    and MASTER_PORT; the backend is the accelerator's (nccl on CUDA, gloo on CPU) unless
    `dist_backend` names one. Without those variables: a world of this one process. A second
    call, or a world already started, changes nothing. No MPI discovery: launch with torchrun.
    `rank` / `world_size` (>= 0) override the environment; `distributed_port` is the port when
    MASTER_PORT is unset. `dist_init_required=False` starts nothing."""
    if dist_init_required is False or is_initialized():
        return
    from ..helpers.accelerator import get_accelerator

    backend = dist_backend or get_accelerator().communication_backend_name()
    world = world_size if world_size >= 0 else int(os.environ.get("WORLD_SIZE", 1))
    me = rank if rank >= 0 else int(os.environ.get("RANK", 0))
    kwargs = {"timeout": timeout} if timeout is not None else {}
    if world == 1 and init_method is None and "MASTER_ADDR" not in os.environ:
        kwargs["store"] = dist.HashStore()  # one process: no address to meet at
    else:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(distributed_port))
        kwargs["init_method"] = init_method or "env://"
    if verbose and me == 0:
        log.info(f"init_distributed: backend {backend}, world size {world}")
    dist.init_process_group(backend=backend, rank=me, world_size=world, **kwargs)
    init_parallel()  # the heartbeat that names a dead rank, and this rank's device


def destroy_process_group(group=None) -> None:
    if is_initialized():
        dist.destroy_process_group(group)


def get_rank(group=None) -> int:
    return dist.get_rank(group) if is_initialized() else 0


def get_world_size(group=None) -> int:
    return dist.get_world_size(group) if is_initialized() else 1


def get_local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0))


def get_global_rank(group=None, group_rank: int = 0) -> int:
    return dist.get_global_rank(group, group_rank) if is_initialized() and group is not None else group_rank


def get_all_ranks_from_group(group=None) -> list[int]:
    return dist.get_process_group_ranks(group or dist.group.WORLD) if is_initialized() else [0]


def get_world_group():
    return dist.group.WORLD if is_initialized() else None


def get_backend(group=None) -> str | None:
    return dist.get_backend(group) if is_initialized() else None


def new_group(ranks=None, **kwargs):
    return dist.new_group(ranks, **kwargs) if is_initialized() else None


def _run(name: str, fn, tensors, group, async_op: bool, alone=None, **kwargs):
    """One counted call; `alone()` is what a world of one does instead."""
    _sent[name][0] += 1
    _sent[name][1] += sum(t.numel() * t.element_size() for t in tensors if torch.is_tensor(t))
    if not is_initialized() or get_world_size(group) == 1:
        if alone is not None:
            alone()
        return _DoneWork() if async_op else None
    comm = Comm(ParallelState(rank=dist.get_rank(group), world_size=dist.get_world_size(group)), group,
                global_rank=dist.get_rank())
    return comm._call(name, fn, async_op=async_op, **kwargs)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op: bool = False):
    return _run("all_reduce", lambda **kw: dist.all_reduce(tensor, op=op, **kw), [tensor], group, async_op)


inference_all_reduce = all_reduce


def reduce(tensor, dst: int, op=ReduceOp.SUM, group=None, async_op: bool = False):
    return _run("reduce", lambda **kw: dist.reduce(tensor, dst, op=op, **kw), [tensor], group, async_op)


def broadcast(tensor, src: int, group=None, async_op: bool = False):
    return _run("broadcast", lambda **kw: dist.broadcast(tensor, src, **kw), [tensor], group, async_op)


def all_gather(tensor_list, tensor, group=None, async_op: bool = False):
    return _run("all_gather", lambda **kw: dist.all_gather(tensor_list, tensor, **kw), [tensor], group, async_op,
                alone=lambda: tensor_list[0].copy_(tensor))


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op: bool = False):
    return _run("all_gather_into_tensor", lambda **kw: dist.all_gather_into_tensor(output_tensor, input_tensor, **kw),
                [input_tensor], group, async_op, alone=lambda: output_tensor.copy_(input_tensor))


def reduce_scatter_tensor(output_tensor, input_tensor, op=ReduceOp.SUM, group=None, async_op: bool = False):
    return _run("reduce_scatter_tensor",
                lambda **kw: dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, **kw),
                [input_tensor], group, async_op, alone=lambda: output_tensor.copy_(input_tensor))


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op: bool = False):
    return _run("reduce_scatter", lambda **kw: dist.reduce_scatter(output, input_list, op=op, **kw),
                input_list, group, async_op, alone=lambda: output.copy_(input_list[0]))


def gather(tensor, gather_list=None, dst: int = 0, group=None, async_op: bool = False):
    return _run("gather", lambda **kw: dist.gather(tensor, gather_list, dst, **kw), [tensor], group, async_op,
                alone=lambda: gather_list[0].copy_(tensor) if gather_list else None)


def scatter(tensor, scatter_list=None, src: int = 0, group=None, async_op: bool = False):
    return _run("scatter", lambda **kw: dist.scatter(tensor, scatter_list, src, **kw), [tensor], group, async_op,
                alone=lambda: tensor.copy_(scatter_list[0]) if scatter_list else None)


def all_to_all_single(output, tensor, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op: bool = False):
    return _run("all_to_all_single", lambda **kw: dist.all_to_all_single(
        output, tensor, output_split_sizes, input_split_sizes, **kw), [tensor], group, async_op,
        alone=lambda: output.copy_(tensor))


def barrier(group=None, async_op: bool = False, device_ids=None):
    return _run("barrier", lambda **kw: dist.barrier(**kw), [], group, async_op)


def monitored_barrier(group=None, timeout=None, wait_all_ranks: bool = False) -> None:
    _run("monitored_barrier", lambda async_op, **kw: dist.monitored_barrier(
        timeout=timeout, wait_all_ranks=wait_all_ranks, **kw), [], group, False)


def send(tensor, dst: int, group=None, tag: int = 0) -> None:
    _sent["send"][0] += 1
    dist.send(tensor, dst, group=group, tag=tag)


def recv(tensor, src: int | None = None, group=None, tag: int = 0) -> int:
    _sent["recv"][0] += 1
    return dist.recv(tensor, src, group=group, tag=tag)


def isend(tensor, dst: int, group=None, tag: int = 0):
    _sent["isend"][0] += 1
    return dist.isend(tensor, dst, group=group, tag=tag)


def irecv(tensor, src: int | None = None, group=None, tag: int = 0):
    _sent["irecv"][0] += 1
    return dist.irecv(tensor, src, group=group, tag=tag)


def all_gather_object(object_list: list, obj, group=None) -> None:
    def alone():
        object_list[0] = obj

    _run("all_gather_object", lambda async_op, **kw: dist.all_gather_object(object_list, obj, **kw), [], group,
         False, alone=alone)


def broadcast_object_list(object_list: list, src: int = 0, group=None, device=None) -> None:
    _run("broadcast_object_list", lambda async_op, **kw: dist.broadcast_object_list(object_list, src, **kw), [],
         group, False)


def log_summary(show_straggler: bool = False) -> str:
    """Calls and bytes per operation sent through this module, logged on rank 0 and returned.
    `show_straggler` has no effect (per-rank latencies are not recorded)."""
    rows = [f"{op:<24} {calls:>8} {size / 2**20:>12.3f}" for op, (calls, size) in sorted(_sent.items())]
    text = "\n".join([f"{'comm op':<24} {'calls':>8} {'MiB sent':>12}", *rows])
    if get_rank() == 0:
        log.info("communication summary\n" + text)
    return text


def configure(deepspeed_config=None, enabled=None, prof_all=None, prof_ops=None, verbose=None, debug=None) -> None:
    """DeepSpeed's comms-logger switch: the counts above are always kept, so nothing to set."""


__all__ = ["ReduceOp", "is_available", "is_initialized", "init_distributed", "destroy_process_group", "get_rank",
           "get_world_size", "get_local_rank", "get_global_rank", "get_all_ranks_from_group", "get_world_group",
           "get_backend", "new_group", "all_reduce", "inference_all_reduce", "reduce", "broadcast", "all_gather",
           "all_gather_into_tensor", "reduce_scatter_tensor", "reduce_scatter", "gather", "scatter",
           "all_to_all_single", "barrier", "monitored_barrier", "send", "recv", "isend", "irecv", "all_gather_object",
           "broadcast_object_list", "log_summary", "configure"]
