"""How initialize builds a pipeline: the ModelSplit (parallel/split.py) of a PipelineModule.

ZeRO runs over the mesh's data dimension (the batch triad counts data-parallel ranks only, as
DeepSpeed's does), the gradient norm spans the pipeline, tied copies start equal, and the
`"pipeline"` block is checked against the module and acted on (or named as having no effect).
"""

from __future__ import annotations

import logging

from .config import NO_EFFECT, PLACEMENT, PipelineConfig
from ...errors import ConfigError
from ..split import ModelSplit
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
        half = "bf16" if cfg.bf16.enabled else "fp16" if cfg.fp16.enabled else None
        if half and cfg.data_types.grad_accum_dtype == "fp32" and cfg.gradient_accumulation_steps > 1:
            log.info("data_types.grad_accum_dtype fp32: no effect with a PipelineModule; torch's schedule adds each "
                     "micro-batch's gradients into the parameters' %s gradients (DeepSpeed's pipeline engine does "
                     "the same without this key)", half)
        for key, why in NO_EFFECT.items():
            if key in raw:
                log.info("pipeline.%s: accepted, no effect (%s)", key, why)
        for key, arg in (("partition", "partition_method"), ("seed_layers", "seed_layers")):
            if key in raw:
                log.info("pipeline.%s: no effect on a PipelineModule you build (its %s argument decides); "
                         "zerotrain train --pipeline_parallel_size uses it", key, arg)
    return pc


def pipeline_parallel_split(module, comm, mpu=None) -> ModelSplit:
    """With a tensor axis (topology=PipeModelDataParallelTopology(..., num_mp=T, ...)) each
    stage's blocks are split over it after the tied copies agree (parallel/tensor/setup.py)."""
    from ..tensor.setup import replicated, split_model
    from ..topology import Grid

    if mpu is not None and not isinstance(mpu, Grid):
        raise ConfigError("initialize: a PipelineModule brings its own topology; do not pass mpu= with it")
    mesh = module.mesh
    ties = Ties(module, mesh)
    chosen: dict = {}
    tensor, tensor_comm = mesh.size("tensor"), mesh.comm("tensor")
    replaced: dict = {}

    def check(cfg) -> None:
        chosen["pipeline"] = _check(module, cfg)
        if cfg.tensor_parallel.size not in (1, tensor):
            raise ConfigError(f"tensor_parallel.autotp_size {cfg.tensor_parallel.size}, but the PipelineModule's "
                              f"topology has {tensor} tensor rank(s); build it with topology=PipeModelDataParallel"
                              f"Topology(num_pp, num_mp={cfg.tensor_parallel.size}, num_dp), or make them equal")
        if cfg.tensor_parallel.vocab_parallel_lm_head:
            raise ConfigError("tensor_parallel.vocab_parallel_lm_head true with a PipelineModule: the vocabulary split "
                              "is built for whole models only (a stage's embedding and head stay whole); remove it")

    def after_broadcast() -> None:
        ties.sync_weights()
        if tensor > 1:
            for t in list(module.parameters()) + list(module.buffers()):
                tensor_comm.broadcast(t.data)
            replaced.update(split_model(module, mesh, plan=module.held_tensor_plan())[0])

    def uncounted() -> list:
        out = {id(p): p for p in ties.uncounted()}
        if mesh.coord("tensor") > 0:
            out.update({id(p): p for p in replicated(module)})
        return list(out.values())

    def make_engine(*args, **kwargs):
        engine = PipelineEngine(*args, **kwargs, ties=ties, pipe_config=chosen["pipeline"])
        if tensor > 1:
            engine.checkpoint_prefix += f"tp_{mesh.coord('tensor'):02d}-"
            engine.input_replica = mesh.coord("tensor") > 0
        return engine

    return ModelSplit(mesh.comm("data"), mesh.comm("pipe", "tensor"), uncounted=uncounted, check=check,
                  after_broadcast=after_broadcast, make_engine=make_engine, replaced=replaced,
                  accumulates_in_grads=True)
