"""Gradient buckets launched during backward, as soon as each one is complete.

A bucket is a range [start, end) of one FlatGroup's flat layout. Stage 0 cuts buckets at
parameter boundaries; stages 1 and 2 also cut at shard boundaries, so that every bucket has
exactly one owner rank and can be *reduced* to it (the sum lands only where the optimizer
needs it: half the traffic of an all-reduce).

    layout   | p5 | p4 |  p3  | p2 | p1 | p0 |pad|
    shards   |    rank 0      |     rank 1      |
    buckets  |  b0     | b1   | b2   |  b3      |     (b1/b2 split p3 at the shard edge)

A post-accumulate-grad hook per parameter counts, for each bucket the parameter touches,
how many of its parameters are final; a complete bucket's collective is launched at once,
asynchronously, while backward carries on. Buckets launch in one fixed order on every rank
(collectives must be issued in the same order everywhere), so a bucket that is ready early
waits for its predecessors. Parameters that got no gradient (unused in this step) release
their buckets when backward ends, so they neither hang the job nor corrupt the reduction.
What a launch does, and what happens to a gradient when it is final (kept in place as a
view, or copied out and freed), is the strategy's choice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .flat import FlatGroup


@dataclass
class Bucket:
    group: int  # index of the FlatGroup
    start: int  # element range in the group's flat layout
    end: int
    owner: int = -1  # rank the bucket is reduced to; -1: every rank (all-reduce)
    params: list[int] = field(default_factory=list)  # indices of the params it overlaps
    order_key: int = 0  # backward position of its last-ready parameter
    pending: int = 0
    launched: bool = False
    work: object = None
    data: torch.Tensor | None = None  # what was sent (a view, or a staging buffer)


def plan_buckets(groups: list[FlatGroup], bucket_numel: int, backward_pos: dict[int, int],
                 split_at_shards: bool = False) -> list[Bucket]:
    """Cut every group into buckets and order them by when they should be complete."""
    buckets = []
    for gi, group in enumerate(groups):
        cuts = set()
        start = 0
        for offset, numel in zip(group.offsets, group.numels):
            if offset + numel - start >= bucket_numel:
                cuts.add(offset + numel)
                start = offset + numel
        if split_at_shards:
            cuts.update(group.shard_edges())
        edges = sorted(c for c in cuts if 0 < c < group.padded_numel) + [group.padded_numel]
        lo = 0
        for hi in edges:
            owner = group.owner_of(lo) if split_at_shards else -1
            bucket = Bucket(gi, lo, hi, owner)
            for i, (offset, numel, p) in enumerate(zip(group.offsets, group.numels, group.params)):
                if offset < hi and offset + numel > lo and numel:
                    bucket.params.append(i)
                    bucket.order_key = max(bucket.order_key, backward_pos[id(p)])
            buckets.append(bucket)
            lo = hi
    buckets.sort(key=lambda b: b.order_key)
    return buckets


class BucketedReducer:
    """Arms once per backward; fires `launch` per bucket in a fixed order; waits at the end.

    `on_grad(group, index, param, bucket_indices)` runs first for every final gradient (rebind it into the
    flat buffer, or copy it into staging and free it); `launch(bucket)` sends a complete
    bucket and returns the async handle; `land(bucket)` runs after its handle completed.
    """

    def __init__(self, groups: list[FlatGroup], buckets: list[Bucket], on_grad: Callable,
                 launch: Callable[[Bucket], object], land: Callable[[Bucket], None] | None = None,
                 max_in_flight: int | None = None):
        self.groups = groups
        self.buckets = buckets
        self.on_grad = on_grad
        self.launch = launch
        self.land = land
        self.max_in_flight = max_in_flight
        self.armed = False
        self._next = 0
        self._landed = 0
        self._generation = 0
        self._counted: dict[tuple[int, int], int] = {}
        touches: dict[tuple[int, int], list[int]] = {}
        for bi, b in enumerate(buckets):
            for i in b.params:
                touches.setdefault((b.group, i), []).append(bi)
        self._handles = [
            groups[gi].params[i].register_post_accumulate_grad_hook(self._make_hook(gi, i, bis))
            for (gi, i), bis in touches.items()
        ]

    def _make_hook(self, group: int, index: int, bucket_indices: list[int]):
        key = (group, index)

        def hook(p: torch.Tensor) -> None:
            self.on_grad(group, index, p, bucket_indices)
            if not self.armed or self._counted.get(key) == self._generation:
                return
            self._counted[key] = self._generation
            complete = False
            for bi in bucket_indices:
                bucket = self.buckets[bi]
                if bucket.launched:
                    raise RuntimeError("a parameter received a gradient after its bucket was reduced; "
                                       "with activation checkpointing use use_reentrant=False")
                bucket.pending -= 1
                complete |= bucket.pending == 0
            if complete:
                self._launch_ready()

        return hook

    def arm(self) -> None:
        """Prepare for a backward whose gradients must be reduced."""
        self.armed = True
        self._generation += 1
        self._next = self._landed = 0
        for b in self.buckets:
            b.pending = len(b.params)
            b.launched = False
            b.work = b.data = None

    def _launch_ready(self) -> None:
        while self._next < len(self.buckets) and self.buckets[self._next].pending <= 0:
            b = self.buckets[self._next]
            b.work = self.launch(b)
            b.launched = True
            self._next += 1
            if self.max_in_flight is not None:
                while self._next - self._landed > self.max_in_flight:
                    self._land_oldest()
            # land whatever already arrived: its staging memory is free from now on
            while self._landed < self._next and self.buckets[self._landed].work.is_completed():
                self._land_oldest()

    def _land_oldest(self) -> None:
        b = self.buckets[self._landed]
        b.work.wait()
        if self.land is not None:
            self.land(b)
        b.work = b.data = None  # a finished handle still holds its tensors: let them go
        self._landed += 1

    def finish(self) -> None:
        """Launch what unused parameters held back, then wait for and land every bucket."""
        if not self.armed:
            return
        for b in self.buckets[self._next :]:
            b.pending = 0
        self._launch_ready()
        while self._landed < len(self.buckets):
            self._land_oldest()
        self.armed = False

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
