"""ZeRO stage 0: plain data parallelism over flat buffers.

Every rank holds the whole model, its gradients and optimizer state. Gradients are averaged
with bucketed all-reduces launched during backward (buckets.py). The optimizer steps one
flat fp32 tensor per param group:

    fp32 training:   model params == master (views into one buffer), grads are views too,
                     so the step touches no copies at all.
    fp16/bf16:       model params and grads live in a half-precision buffer; an fp32 master
                     buffer is what the optimizer steps, and is cast back after each step.
"""

from __future__ import annotations

import torch

from .buckets import Bucket, BucketedReducer, plan_buckets
from .flat import FlatGroup, FlatModel
from .strategy import ZeroStrategy


class DataParallel(ZeroStrategy):
    stage = 0
    shards_optimizer = False

    def __init__(self, param_groups, registration, comm, compute_dtype, device, **kwargs):
        super().__init__(param_groups, registration, comm, compute_dtype, device, **kwargs)
        self.groups = [FlatGroup(ps, comm.world_size, sharded=False) for ps in self.ordered]
        self.flat = FlatModel(self.groups, compute_dtype, device, whole_grads=True,
                              accumulation_dtype=self.accumulation_dtype)
        self._make_masters(self.flat.buffers, self.flat.grad_buffers)
        buckets = plan_buckets(self.groups, self.bucket_numel, self.backward_pos)
        self.reducer = BucketedReducer(self.groups, buckets, self.flat.rebind_grad, self._launch, self._land,
                                       max_in_flight=None if self.overlap_comm else 1)

    # ---- backward ------------------------------------------------------------------------
    def _launch(self, bucket: Bucket):
        self.flat.fold_accumulated(bucket.group, bucket.start, bucket.end)
        bucket.data = self.flat.grad_buffers[bucket.group][bucket.start : bucket.end]
        self.averaging.scale_before_sum(bucket.data)
        return self.comm.all_reduce(bucket.data, async_op=True)

    def _land(self, bucket: Bucket) -> None:
        self.averaging.scale_after_sum(bucket.data)

    def end_backward(self) -> None:
        super().end_backward()
        self.flat.after_backward(self.at_boundary, self.comm.alone)

    # ---- step ----------------------------------------------------------------------------
    def take_assigned_grads(self) -> None:
        self.flat.adopt_assigned_grads()

    def reduced_grads(self) -> list[torch.Tensor]:
        return self.flat.grad_buffers

    def after_step(self) -> None:
        self.zero_grad()  # separate masters were written into the model block by block

    def zero_grad(self) -> None:
        self.flat.zero_grad()

    # ---- accounting and checkpoints --------------------------------------------------------
    def memory_tensors(self) -> list[tuple[str, str, torch.Tensor]]:
        return self.flat.memory_tensors() + self.master_tensors()

    def load_state_dict(self, state: dict) -> None:
        self.load_masters(state)
