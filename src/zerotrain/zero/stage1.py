"""ZeRO stage 1: fp32 master weights and optimizer states sharded across ranks.

Each rank owns one contiguous 1/N slice of every group's flat buffer (layout.py, "flat")
and steps only that slice; the updated slices are then all-gathered in place into the full
buffer, so the model sees whole parameters again. Gradients stay whole on every rank (as
in stage 0), but each bucket is *reduced* to the rank that owns it, not all-reduced: the
sum is only needed where the optimizer reads it. Reduce + all-gather move the same bytes as
stage 0's all-reduce.
"""

from __future__ import annotations

import torch

from .buckets import Bucket, BucketedReducer, plan_buckets
from .flat import FlatGroup, FlatModel
from .strategy import ZeroStrategy


class ShardedOptimizer(ZeroStrategy):
    stage = 1

    def __init__(self, param_groups, registration, comm, compute_dtype, device, **kwargs):
        super().__init__(param_groups, registration, comm, compute_dtype, device, **kwargs)
        self.groups = [FlatGroup(ps, comm.world_size) for ps in self.ordered]
        self.flat = FlatModel(self.groups, compute_dtype, device, whole_grads=True,
                              accumulation_dtype=self.accumulation_dtype)
        self._make_masters(self.flat.shards(self.flat.buffers, comm.rank),
                           self.flat.shards(self.flat.grad_buffers, comm.rank))
        buckets = plan_buckets(self.groups, self.bucket_numel, self.backward_pos, split_at_shards=True)
        self.reducer = BucketedReducer(self.groups, buckets, self.flat.rebind_grad, self._launch, self._land,
                                       max_in_flight=None if self.overlap_comm else 1)

    # ---- backward ------------------------------------------------------------------------
    def _launch(self, bucket: Bucket):
        self.flat.fold_accumulated(bucket.group, bucket.start, bucket.end)
        bucket.data = self.flat.grad_buffers[bucket.group][bucket.start : bucket.end]
        self.averaging.scale_before_sum(bucket.data)
        return self.comm.reduce(bucket.data, dst=bucket.owner, async_op=True)

    def _land(self, bucket: Bucket) -> None:
        if bucket.owner == self.comm.rank:
            self.averaging.scale_after_sum(bucket.data)

    def end_backward(self) -> None:
        super().end_backward()
        self.flat.after_backward(self.at_boundary, self.comm.alone)

    # ---- step ----------------------------------------------------------------------------
    def take_assigned_grads(self) -> None:
        self.flat.adopt_assigned_grads()

    def reduced_grads(self) -> list[torch.Tensor]:
        return self.flat.shards(self.flat.grad_buffers, self.comm.rank)

    def after_step(self) -> None:
        self.flat.publish(self.comm)
        self.zero_grad()

    def zero_grad(self) -> None:
        self.flat.zero_grad()

    # ---- accounting and checkpoints --------------------------------------------------------
    def memory_tensors(self) -> list[tuple[str, str, torch.Tensor]]:
        return self.flat.memory_tensors() + self.master_tensors()

    def load_state_dict(self, state: dict) -> None:
        if self.load_masters(state):
            self.flat.publish(self.comm)
