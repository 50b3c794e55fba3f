"""Gradient buckets launched during backward, as soon as each one is complete.

Each FlatGroup's gradient buffer is cut at parameter boundaries into buckets of about
`bucket_numel` elements. A post-accumulate-grad hook counts the parameters of a bucket whose
gradient is final; when the count is full the bucket's collective is launched asynchronously
while backward carries on with earlier layers. Buckets launch in one fixed order on every
rank (a bucket that is ready early waits for its predecessors), because collectives must be
issued in the same order everywhere. Buckets whose parameters got no gradient at all (unused
parameters) are launched when backward ends, so a parameter unused on one rank neither hangs
the job nor corrupts the reduction.

What a launch does is the strategy's choice (all-reduce for stage 0 and 1, reduce-scatter
into a shard for stage 2): it is passed in as `launch(bucket) -> work handle`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .flat import FlatGroup


@dataclass
class Bucket:
    group: int  # index of the FlatGroup
    start: int  # element offsets in the group's buffer
    end: int
    params: list[int] = field(default_factory=list)  # indices into the group's params
    order_key: int = 0  # backward position of its last-ready parameter
    pending: int = 0
    work: object = None


def plan_buckets(groups: list[FlatGroup], bucket_numel: int, backward_pos: dict[int, int]) -> list[Bucket]:
    """Cut each group at parameter boundaries and order buckets by when they should be ready.

    `backward_pos[id(p)]` is the parameter's expected position in backward (reverse
    registration). The last bucket of a group absorbs the padding so buckets tile the buffer.
    """
    buckets = []
    for gi, group in enumerate(groups):
        current = Bucket(gi, 0, 0)
        for i, (offset, numel, p) in enumerate(zip(group.offsets, group.numels, group.params)):
            current.params.append(i)
            current.order_key = max(current.order_key, backward_pos[id(p)])
            is_last = i == len(group.params) - 1
            if offset + numel - current.start >= bucket_numel or is_last:
                current.end = group.padded_numel if is_last else offset + numel
                buckets.append(current)
                current = Bucket(gi, current.end, current.end)
    buckets.sort(key=lambda b: b.order_key)
    return buckets


class BucketedReducer:
    """Arms once per backward; fires `launch` per bucket in a fixed order; waits at the end."""

    def __init__(self, groups: list[FlatGroup], grad_buffers: list[torch.Tensor], bucket_numel: int,
                 backward_pos: dict[int, int], launch: Callable[[Bucket, torch.Tensor], object]):
        self.grad_buffers = grad_buffers
        self.launch = launch
        self.buckets = plan_buckets(groups, max(1, bucket_numel), backward_pos)
        self._armed = False
        self._next = 0
        self._generation = 0
        self._counted: dict[int, int] = {}
        self._handles = []
        for bi, b in enumerate(self.buckets):
            group = groups[b.group]
            views = group.views(grad_buffers[b.group])
            for i in b.params:
                hook = self._make_hook(bi, views[i])
                self._handles.append(group.params[i].register_post_accumulate_grad_hook(hook))

    def _make_hook(self, bucket_index: int, view: torch.Tensor):
        key = id(view)

        def hook(p: torch.Tensor) -> None:
            if p.grad is not view:
                # The user set .grad to None (e.g. model.zero_grad()); autograd made a fresh
                # tensor. Move it back into the flat buffer so the layout stays valid.
                view.copy_(p.grad)
                p.grad = view
            if not self._armed or self._counted.get(key) == self._generation:
                return
            self._counted[key] = self._generation
            bucket = self.buckets[bucket_index]
            if bucket.work is not None:
                raise RuntimeError("a parameter received a gradient after its bucket was reduced; "
                                   "use torch.utils.checkpoint with use_reentrant=False")
            bucket.pending -= 1
            if bucket.pending == 0:
                self._launch_ready()

        return hook

    def arm(self) -> None:
        """Prepare for a backward whose gradients must be reduced (the accumulation boundary)."""
        self._armed = True
        self._generation += 1
        self._next = 0
        for b in self.buckets:
            b.pending = len(b.params)
            b.work = None

    def _launch_ready(self) -> None:
        while self._next < len(self.buckets) and self.buckets[self._next].pending <= 0:
            b = self.buckets[self._next]
            b.work = self.launch(b, self.grad_buffers[b.group][b.start : b.end])
            self._next += 1

    def finish(self) -> None:
        """Launch what unused parameters held back, then wait for every bucket."""
        if not self._armed:
            return
        for b in self.buckets[self._next :]:
            b.pending = 0
        self._launch_ready()
        for b in self.buckets:
            b.work.wait()
        self._armed = False

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
