"""ZeRO stage 1: fp32 master weights and optimizer states sharded across ranks.

Each rank owns one contiguous 1/N slice of every group's flat buffer (flat.py) and steps
only that slice; the updated slices are then all-gathered in place into the full buffer,
so the model sees whole parameters again. Gradients stay whole on every rank (as in stage
0), but each bucket is *reduced* to the rank that owns it, not all-reduced: the sum is only
needed where the optimizer reads it. Reduce + all-gather move the same bytes as stage 0's
all-reduce.
"""

from __future__ import annotations

import math

import torch

from .buckets import Bucket
from .stage0 import DataParallel


def sharded_grad_norm(shards: list[torch.Tensor], comm, loss_scale: float) -> float:
    """Sum of squares over this rank's gradient shards, summed over ranks: the global norm
    (inf/nan on any rank's overflow reaches every rank)."""
    norms = torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32) for g in shards])
    squares = (norms.double() ** 2).sum().reshape(1)
    comm.all_reduce(squares)
    return math.sqrt(squares.item()) / loss_scale


class ShardedOptimizer(DataParallel):
    stage = 1
    split_buckets_at_shards = True

    def _shard(self, buffer: torch.Tensor, group: int) -> torch.Tensor:
        return self.groups[group].shard(buffer, self.comm.rank)

    def _make_masters(self) -> list[torch.nn.Parameter]:
        masters = []
        for gi, (model_buf, grad_buf) in enumerate(zip(self.model_buffers, self.grad_buffers)):
            shard = self._shard(model_buf, gi)
            if self.separate_masters:
                master = self.offload.new_master(shard)
            else:  # the slice of the model buffer itself: the step writes the model directly
                master = torch.nn.Parameter(shard)
                master.grad = self._shard(grad_buf, gi)
            masters.append(master)
        return masters

    def _launch(self, bucket: Bucket):
        bucket.data = self.grad_buffers[bucket.group][bucket.start : bucket.end]
        self.averaging.scale_before_sum(bucket.data)
        return self.comm.reduce(bucket.data, dst=bucket.owner, async_op=True)

    def _land(self, bucket: Bucket) -> None:
        if bucket.owner == self.comm.rank:
            super()._land(bucket)

    def _step_grads(self) -> list[torch.Tensor]:
        return [self._shard(g, gi) for gi, g in enumerate(self.grad_buffers)]

    def grad_norm(self, loss_scale: float = 1.0) -> float:
        return sharded_grad_norm(self._step_grads(), self.comm, loss_scale)

    def after_step(self) -> None:
        for gi, (model_buf, master) in enumerate(zip(self.model_buffers, self.masters)):
            shard = self._shard(model_buf, gi)
            if self.separate_masters:
                shard.copy_(master.detach())
            self.comm.all_gather(model_buf, shard)
        self.zero_grad()

    def load_state_dict(self, state: dict) -> None:
        if not self.separate_masters:
            return
        saved = state.get("masters")
        for gi, (master, model_buf) in enumerate(zip(self.masters, self.model_buffers)):
            shard = self._shard(model_buf, gi)
            master.data.copy_(saved[gi] if saved is not None else shard)
            shard.copy_(master.detach())
            self.comm.all_gather(model_buf, shard)
