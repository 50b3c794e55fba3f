"""torch's stages and schedule for each input shape, built once and kept.

A torch PipelineStage learns its input and output shapes at its first step (a metadata pass
between the stages) and keeps receive buffers of those shapes: fed a new sequence length it
would read stale data, or abort on gloo. A sequence-length curriculum changes the shape from
step to step, so every shape gets its own stages and schedule, over the same layers: the
first step at a new length pays the metadata pass (about one micro-batch's forward and the
input-gradient backward, measured by benchmarks/compare_pipeline.py), later steps at that
length reuse them. The least recently used shape is dropped beyond `capacity`
(pipeline.max_cached_shapes), which frees its buffers. All ranks of a pipeline use the same
key (data.py agrees on it), so they always pick matching stages.
"""

from __future__ import annotations

from collections import OrderedDict

from .schedules import StageSchedule


class StageCache:
    def __init__(self, module, schedule: str, group, device, loss_fn, capacity: int):
        self.module, self.schedule, self.group, self.device = module, schedule, group, device
        self.loss_fn, self.capacity = loss_fn, capacity
        self._entries: OrderedDict = OrderedDict()
        self.built = 0  # stage sets built so far (one per new shape)

    def get(self, key, micro_batches: int, train: bool) -> StageSchedule:
        full = (key, micro_batches, train)
        if full in self._entries:
            self._entries.move_to_end(full)
            return self._entries[full]
        chunks = [(stage.index, stage) for stage in self.module.stages()]
        total = self.module.num_stages * self.module.virtual_stages
        pipeline = StageSchedule(self.schedule, chunks, total, self.device, self.group, micro_batches, self.loss_fn,
                            train=train)
        self.built += 1
        self._entries[full] = pipeline
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return pipeline

    def __len__(self) -> int:
        return len(self._entries)
