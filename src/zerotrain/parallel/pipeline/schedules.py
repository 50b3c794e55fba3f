"""Thin wrappers over torch.distributed.pipelining: stages and schedules by name.

zerotrain has no scheduler and no point-to-point layer of its own: torch's PipelineStage
moves activations and gradients, torch's schedules order the work. What is here: the
schedule names of the `pipeline.schedule` config key, where each schedule puts a rank's
stages (one stage; `virtual_stages` stages looped, rank r holding r, r+P, ...; or two in a
V, rank r holding r and 2P-1-r), a stage that counts the seconds it computes (the bubble is
the rest of the step). A pipeline of one process still needs a process group for torch's
stages: comm/collectives.py makes a one-rank one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed.pipelining as pp

from ...comm.collectives import ensure_process_group
from ...errors import ConfigError


@dataclass(frozen=True)
class ScheduleKind:
    cls: type
    placement: str  # "single", "loop" or "v"
    zero_bubble: bool = False  # splits backward into input and weight passes


SCHEDULES = {
    "1f1b": ScheduleKind(pp.Schedule1F1B, "single"),
    "gpipe": ScheduleKind(pp.ScheduleGPipe, "single"),
    "interleaved_1f1b": ScheduleKind(pp.ScheduleInterleaved1F1B, "loop"),
    "looped_bfs": ScheduleKind(pp.ScheduleLoopedBFS, "loop"),
    "interleaved_zero_bubble": ScheduleKind(pp.ScheduleInterleavedZeroBubble, "loop", zero_bubble=True),
    "zbv_zero_bubble": ScheduleKind(pp.ScheduleZBVZeroBubble, "v", zero_bubble=True),
    "dualpipev": ScheduleKind(pp.ScheduleDualPipeV, "v", zero_bubble=True),
}


def stage_indices(schedule: str, pipe_rank: int, pipe_size: int, virtual: int) -> list[int]:
    """The pipeline stages (of pipe_size x virtual) that rank `pipe_rank` runs."""
    placement = SCHEDULES[schedule].placement
    if placement == "single":
        return [pipe_rank]
    if placement == "loop":
        return [pipe_rank + k * pipe_size for k in range(virtual)]
    return [pipe_rank, 2 * pipe_size - 1 - pipe_rank]


class _TimedStage(pp.PipelineStage):
    """A PipelineStage that adds the seconds of its forward and backward work to `busy_s`
    (the schedule calls these after waiting for their inputs, so waiting is not counted),
    and calls `before_last_backward` (when set) before the step's last micro-batch backward."""

    busy_s = 0.0
    before_last_backward = None

    def forward_one_chunk(self, fwd_chunk_id: int, *args, **kwargs):
        self.submod.micro_batch = fwd_chunk_id  # which micro-batch of the step the layers run (module.py)
        start = time.perf_counter()
        try:
            return super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)
        finally:
            self.busy_s += time.perf_counter() - start

    def backward_one_chunk(self, *args, **kwargs):
        if kwargs.get("last_backward") and self.before_last_backward is not None:
            self.before_last_backward()
        start = time.perf_counter()
        try:
            return super().backward_one_chunk(*args, **kwargs)
        finally:
            self.busy_s += time.perf_counter() - start

    def backward_weight_one_chunk(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return super().backward_weight_one_chunk(*args, **kwargs)
        finally:
            self.busy_s += time.perf_counter() - start


class StageSchedule:
    """One torch schedule over this rank's stages, for one set of input shapes (torch fixes
    a stage's shapes at its first step)."""

    def __init__(self, schedule: str, chunks: list[tuple[int, torch.nn.Module]], num_stages: int,
                 device: torch.device, group, n_microbatches: int, loss_fn, train: bool = True):
        ensure_process_group()
        if not train and SCHEDULES[schedule].placement == "single":
            schedule = "gpipe"  # forward only: any order does, and gpipe takes any micro-batch count
        if schedule == "1f1b" and n_microbatches < num_stages:
            # torch's 1F1B wants a micro-batch per stage; with fewer, its warm-up already holds
            # every forward, so GPipe's order does the same arithmetic (DeepSpeed's 1F1B takes any count)
            schedule = "gpipe"
        kind = SCHEDULES[schedule]
        self.stages = [_TimedStage(module, index, num_stages, device, group=group) for index, module in chunks]
        self.has_first = any(s.is_first for s in self.stages)
        self.has_last = any(s.is_last for s in self.stages)
        target = self.stages[0] if kind.placement == "single" else self.stages
        try:
            self.schedule = kind.cls(target, n_microbatches, loss_fn=loss_fn, scale_grads=False)
        except ValueError as e:  # its constraints on the micro-batch count, in torch's words
            raise ConfigError(f"pipeline.schedule {schedule} with {n_microbatches} micro-batches per step "
                              f"(gradient_accumulation_steps): {e}") from None
        self.train = train
        # one stage, whole backwards: its last micro-batch's backward is this rank's last
        # gradient work of the step (looped stages and split backwards interleave others after it)
        self.last_backward_is_last = kind.placement == "single" and not kind.zero_bubble

    def before_last_backward(self, hook) -> None:
        """`hook()` runs just before the step's last backward on this rank (see
        last_backward_is_last), so gradients can be reduced while that backward runs."""
        self.stages[0].before_last_backward = hook

    @property
    def busy_s(self) -> float:
        return sum(s.busy_s for s in self.stages)

    def run(self, inputs: tuple | None, target: torch.Tensor | None) -> None:
        """One pass over all micro-batches: `inputs` (the micro-batches' inputs stacked along
        dim 0) where this rank holds the first stage, `target` where it holds the last."""
        args = inputs if self.has_first and inputs is not None else ()
        kwargs = {"target": target} if self.has_last else {}
        if self.train:
            self.schedule.step(*args, return_outputs=False, **kwargs)
        else:
            self.schedule.eval(*args, **kwargs)
