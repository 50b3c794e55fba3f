"""ZeRO stage 2: gradients sharded too.

No rank keeps a whole-model gradient buffer. As each parameter's gradient becomes final in
backward it is copied into the staging buffer of the bucket(s) it falls in and freed; a full
bucket is reduced to its owner rank, which adds it into its fp32 gradient shard. At most two
buckets are in flight (double buffering) when overlap_comm is on, one when it is off, so the
gradient memory per rank is the shard plus a couple of buckets. Because gradients are not
kept, the reduction runs at every micro step, also inside gradient accumulation.
"""

from __future__ import annotations

import torch

from .buckets import Bucket
from .stage0 import attach_and_scale
from .stage1 import ShardedOptimizer


class ShardedGradients(ShardedOptimizer):
    stage = 2

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reducer.max_in_flight = 2 if self.overlap_comm else 1

    def _make_grad_buffers(self, device) -> list[torch.Tensor]:
        return []  # gradients live in bucket staging buffers only while they travel

    def _make_masters(self) -> list[torch.nn.Parameter]:
        masters = []
        for gi, model_buf in enumerate(self.model_buffers):
            shard = self._shard(model_buf, gi)
            if self.separate_masters:
                master = self.offload.new_master(shard)
            else:
                master = torch.nn.Parameter(shard)
                master.grad = torch.zeros_like(shard)
            masters.append(master)
        return masters

    def begin_backward(self, boundary: bool) -> None:
        self.reducer.arm()  # every micro step: there is nowhere to accumulate whole gradients

    def _on_grad(self, group: int, index: int, p: torch.Tensor, buckets: list[int]) -> None:
        fg = self.groups[group]
        offset, numel = fg.offsets[index], fg.numels[index]
        grad = p.grad.reshape(-1)
        for bi in buckets:
            b = self.reducer.buckets[bi]
            if b.data is None:
                b.data = torch.zeros(b.end - b.start, dtype=self.compute_dtype, device=grad.device)
            lo, hi = max(offset, b.start), min(offset + numel, b.end)
            b.data[lo - b.start : hi - b.start].add_(grad[lo - offset : hi - offset])
        p.grad = None

    def _launch(self, bucket: Bucket):
        if bucket.data is None:  # only padding or unused parameters
            bucket.data = torch.zeros(bucket.end - bucket.start, dtype=self.compute_dtype,
                                      device=self.model_buffers[bucket.group].device)
        self.averaging.scale_before_sum(bucket.data)
        return self.comm.reduce(bucket.data, dst=bucket.owner, async_op=True)

    def _land(self, bucket: Bucket) -> None:
        if bucket.owner != self.comm.rank:
            return
        first = self.comm.rank * self.groups[bucket.group].shard_numel
        acc = self.master_grads[bucket.group][bucket.start - first : bucket.end - first]
        self.averaging.add_sum_into(acc, bucket.data)

    def _step_grads(self) -> list[torch.Tensor]:
        return self.master_grads

    def prepare_step(self, coef: float) -> None:
        attach_and_scale(self.masters, self.master_grads, coef)

    def zero_grad(self) -> None:
        torch._foreach_zero_(self.master_grads)
