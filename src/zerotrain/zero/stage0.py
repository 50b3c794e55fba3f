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
        self.flat = FlatModel(self.groups, compute_dtype, device, whole_grads=True)
        self._make_masters(self.flat.buffers, self.flat.grad_buffers)
        buckets = plan_buckets(self.groups, self.bucket_numel, self.backward_pos)
        self.reducer = BucketedReducer(self.groups, buckets, self.flat.rebind_grad, self._launch, self._land,
                                       max_in_flight=None if self.overlap_comm else 1)

    # ---- backward ------------------------------------------------------------------------
    def _launch(self, bucket: Bucket):
        bucket.data = self.flat.grad_buffers[bucket.group][bucket.start : bucket.end]
        self.averaging.scale_before_sum(bucket.data)
        return self.comm.all_reduce(bucket.data, async_op=True)

    def _land(self, bucket: Bucket) -> None:
        self.averaging.scale_after_sum(bucket.data)

    # ---- step ----------------------------------------------------------------------------
    def take_assigned_grads(self) -> None:
        self.flat.adopt_assigned_grads()

    def reduced_grads(self) -> list[torch.Tensor]:
        return self.flat.grad_buffers

    def after_step(self) -> None:
        if self.separate_masters:
            for model_buf, master in zip(self.flat.buffers, self.masters):
                model_buf.copy_(master.detach())
        self.zero_grad()

    def zero_grad(self) -> None:
        torch._foreach_zero_(self.flat.grad_buffers)

    # ---- accounting and checkpoints --------------------------------------------------------
    def memory_tensors(self) -> list[tuple[str, str, torch.Tensor]]:
        return self.flat.memory_tensors() + self.master_tensors()

    def load_state_dict(self, state: dict) -> None:
        if not self.separate_masters:
            return
        saved = state.get("masters")
        for i, (master, model_buf) in enumerate(zip(self.masters, self.flat.buffers)):
            master.data.copy_(saved[i] if saved is not None else model_buf)
            model_buf.copy_(master.detach())
