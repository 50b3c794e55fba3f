"""ZeRO stage 2: gradients sharded too.

No rank keeps a whole-model gradient buffer. As each parameter's gradient becomes final in
backward it is copied into the staging buffer of the bucket(s) it falls in and freed; a full
bucket is reduced to its owner rank, which adds it into its fp32 gradient shard. At most two
buckets are in flight (double buffering) when overlap_comm is on, one when it is off, so the
gradient memory per rank is the shard plus a couple of buckets. Because gradients are not
kept, the reduction runs at every micro step, also inside gradient accumulation. Parameters,
masters and the all-gather after the step are stage 1's (flat.FlatModel.publish).
"""

from __future__ import annotations

import torch

from ..parallel.tensor.dtensor import local
from .buckets import Bucket, BucketedReducer, plan_buckets
from .flat import FlatGroup, FlatModel
from .strategy import ZeroStrategy


class ShardedGradients(ZeroStrategy):
    stage = 2

    def __init__(self, param_groups, registration, comm, compute_dtype, device, **kwargs):
        super().__init__(param_groups, registration, comm, compute_dtype, device, **kwargs)
        self.groups = [FlatGroup(ps, comm.world_size) for ps in self.ordered]
        self.flat = FlatModel(self.groups, compute_dtype, device, whole_grads=False)
        self._make_masters(self.flat.shards(self.flat.buffers, comm.rank))
        buckets = plan_buckets(self.groups, self.bucket_numel, self.backward_pos, split_at_shards=True)
        self.reducer = BucketedReducer(self.groups, buckets, self._on_grad, self._launch, self._land,
                                       max_in_flight=2 if self.overlap_comm else 1)

    # ---- backward ------------------------------------------------------------------------
    def begin_backward(self, boundary: bool) -> None:
        self.reducer.arm()  # every micro step: there is nowhere to accumulate whole gradients
        self.offload.before_backward(boundary)

    def _on_grad(self, group: int, index: int, p: torch.Tensor, buckets: list[int]) -> None:
        fg = self.groups[group]
        offset, numel = fg.offsets[index], fg.numels[index]
        grad = local(p.grad).reshape(-1)
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
                                      device=self.flat.buffers[bucket.group].device)
        self.averaging.scale_before_sum(bucket.data)
        return self.comm.reduce(bucket.data, dst=bucket.owner, async_op=True)

    def _land(self, bucket: Bucket) -> None:
        if bucket.owner != self.comm.rank:
            return
        first, _ = self.groups[bucket.group].shard_range(self.comm.rank)
        acc = self.master_grads[bucket.group][bucket.start - first : bucket.end - first]
        self.averaging.add_sum_into(acc, bucket.data)

    # ---- step ----------------------------------------------------------------------------
    def reduced_grads(self) -> list[torch.Tensor]:
        return self.master_grads

    def after_step(self) -> None:
        self.flat.publish(self.comm)
        self.zero_grad()

    def zero_grad(self) -> None:
        torch._foreach_zero_(self.master_grads)

    # ---- accounting and checkpoints --------------------------------------------------------
    def memory_tensors(self) -> list[tuple[str, str, torch.Tensor]]:
        return self.flat.memory_tensors() + self.master_tensors()

    def load_state_dict(self, state: dict) -> None:
        if self.load_masters(state):
            self.flat.publish(self.comm)
