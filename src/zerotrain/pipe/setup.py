"""How initialize builds a pipeline: the layout (parallel/layout.py) of a PipelineModule.

ZeRO runs over the mesh's data dimension (the batch triad counts data-parallel ranks only, as
DeepSpeed's does), the gradient norm spans the pipeline, tied copies start equal, and the
`"pipeline"` block is checked against the module and acted on (or named as having no effect).
"""

from __future__ import annotations

import logging

from ..config.pipeline import NO_EFFECT, PLACEMENT, PipelineConfig
from ..errors import ConfigError
from ..parallel.layout import Layout
from .engine import PipelineEngine
from .ties import Ties

log = logging.getLogger("zerotrain")


def _check(module, cfg) -> PipelineConfig:
    pc = cfg.pipeline or PipelineConfig()
    raw = cfg.raw.get("pipeline") or {}
    if pc.stages != "auto" and pc.stages != module.num_stages:
        raise ConfigError(f"pipeline.stages is {pc.stages} but the PipelineModule has num_stages={module.num_stages}; "
                          "make them equal or set \"auto\"")
    placement = PLACEMENT[pc.schedule]
    want = "v" if placement == "v" else "loop"
    if module.virtual_stages != pc.virtual_stages or (pc.virtual_stages > 1 and module.placement != want):
        raise ConfigError(f"pipeline.schedule {pc.schedule} runs {pc.virtual_stages} stage(s) per rank"
                          + (" in a V" if placement == "v" else "") + f"; build the PipelineModule with "
                          f"virtual_stages={pc.virtual_stages}" + (", placement='v'" if placement == "v" else ""))
    stage = cfg.zero_optimization.stage
    if stage > 1:
        raise ConfigError(f"zero_optimization.stage {stage} with pipeline parallelism: use stage 0 or 1 (a "
                          "stage-2 gradient is reduced as it is produced, torch's schedule produces it in pieces)")
    offload = cfg.zero_optimization.offload_optimizer
    if offload is not None and offload.device == "nvme":
        raise ConfigError("zero_optimization.offload_optimizer.device nvme with pipeline parallelism: not supported; "
                          "offload to cpu or not at all")
    if pc.activation_checkpoint_interval:
        module.activation_checkpoint_interval = pc.activation_checkpoint_interval
    module.use_reentrant = bool(pc.use_reentrant)  # unset: torch's non-reentrant form (DeepSpeed: reentrant)
    if module.mesh.state.rank == 0:
        for key, why in NO_EFFECT.items():
            if key in raw:
                log.info("pipeline.%s: accepted, no effect (%s)", key, why)
        for key, arg in (("partition", "partition_method"), ("seed_layers", "seed_layers")):
            if key in raw:
                log.info("pipeline.%s: no effect on a PipelineModule you build (its %s argument decides); "
                         "zerotrain train --pipeline_parallel_size uses it", key, arg)
    return pc


def pipeline_layout(module, comm, mpu=None) -> Layout:
    from ..parallel.topology import Grid

    if mpu is not None and not isinstance(mpu, Grid):
        raise ConfigError("initialize: a PipelineModule brings its own topology; do not pass mpu= with it")
    mesh = module.mesh
    ties = Ties(module, mesh)
    chosen: dict = {}

    def check(cfg) -> None:
        chosen["pipeline"] = _check(module, cfg)

    def make_engine(*args, **kwargs):
        return PipelineEngine(*args, **kwargs, ties=ties, pipe_config=chosen["pipeline"])

    return Layout(mesh.comm("data"), mesh.comm("pipe", "tensor"), uncounted=ties.uncounted, check=check,
                  after_broadcast=ties.sync_weights, make_engine=make_engine)
