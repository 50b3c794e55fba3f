"""The `"pipeline"` block: DeepSpeed's keys for its pipeline engine, plus the schedule.

DeepSpeed reads `stages`, `partition`, `seed_layers`, `activation_checkpoint_interval`,
`pipe_partitioned`, `grad_partitioned` and `use_reentrant` here. zerotrain acts on each or
says that it has none (setup.py notices): `pipe_partitioned` and `grad_partitioned` split
activations across tensor-parallel ranks, which a pipeline of zerotrain does not have.
"""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from ...config.base import Block, FieldProblem, Int, acts, no_effect

# single: one stage per rank; loop: virtual_stages per rank; v: exactly two per rank
PLACEMENT = {"1f1b": "single", "gpipe": "single", "interleaved_1f1b": "loop", "looped_bfs": "loop",
             "interleaved_zero_bubble": "loop", "zbv_zero_bubble": "v", "dualpipev": "v"}
ZERO_BUBBLE = ("interleaved_zero_bubble", "zbv_zero_bubble", "dualpipev")  # backward split in input and weight
NO_EFFECT = {"pipe_partitioned": "it splits activations across tensor-parallel ranks, and this pipeline has none",
             "grad_partitioned": "it splits gradients across tensor-parallel ranks, and this pipeline has none"}


class PipelineConfig(Block):
    enabled: bool = acts(True, "false: the block is off (as any DeepSpeed block that says only \"enabled\": false)")
    schedule: Literal["1f1b", "gpipe", "interleaved_1f1b", "looped_bfs", "interleaved_zero_bubble",
                      "zbv_zero_bubble", "dualpipev"] = acts(
        "1f1b", "torch.distributed.pipelining schedule.", ours="1f1b (zerotrain's own key)")
    virtual_stages: Int = acts(1, "Stages per rank: >= 2 for the interleaved and looped schedules, 2 for "
                                  "zbv_zero_bubble and dualpipev.", ge=1, ours="1 (zerotrain's own key)")
    stages: Int | Literal["auto"] = acts("auto", "Pipeline stages; must match the PipelineModule's.")
    partition: str = acts("best", "How the trainer splits a model (parameters, uniform, type:<regex>; best = "
                                  "parameters); a PipelineModule you build keeps its own.")
    seed_layers: bool = acts(False, "Trainer: seed each layer's construction by its index.")
    activation_checkpoint_interval: Int = acts(0, "Recompute activations every this many layers; 0 disables.", ge=0)
    use_reentrant: bool | None = acts(None, "Reentrant activation checkpointing (DeepSpeed's default true); false "
                                            "is torch's recommended form.")
    pipe_partitioned: bool = no_effect(True, NO_EFFECT["pipe_partitioned"])
    grad_partitioned: bool = no_effect(True, NO_EFFECT["grad_partitioned"])
    max_cached_shapes: Int = acts(8, "Input shapes (e.g. curriculum lengths) whose stages are kept built.", ge=1,
                                  ours="8 (zerotrain's own key)")

    @model_validator(mode="after")
    def _virtual(self) -> PipelineConfig:
        placement = PLACEMENT[self.schedule]
        v = self.virtual_stages
        if placement == "single" and v != 1:
            raise FieldProblem("virtual_stages", f"schedule {self.schedule} runs one stage per rank, got {v}; "
                                                 "use interleaved_1f1b for several")
        if placement == "loop" and v < 2:
            raise FieldProblem("virtual_stages", f"schedule {self.schedule} needs 2 or more stages per rank, got {v}")
        if placement == "v" and v != 2:
            raise FieldProblem("virtual_stages", f"schedule {self.schedule} runs exactly 2 stages per rank, got {v}")
        if self.use_reentrant and self.schedule in ZERO_BUBBLE:
            raise FieldProblem("use_reentrant", f"reentrant checkpointing cannot split the backward in two as "
                                                f"{self.schedule} does; set it to false")
        return self
