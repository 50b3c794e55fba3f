"""ZeRO: one strategy per stage (stage0.py .. stage3/stage.py), each a `ZeroStrategy` (strategy.py,
the contract the engine relies on), over the sharding arithmetic of layout.py, the flat
buffers of flat.py and the gradient buckets of buckets.py. `build_strategy` picks the stage
named in the config."""

from __future__ import annotations

import torch

from ..comm import Comm
from ..errors import ConfigError
from .stage0 import DataParallel
from .stage1 import ShardedOptimizer
from .stage2 import ShardedGradients
from .stage3.gathered_parameters import (GatheredParameters, register_external_parameter, unregister_external_parameter,
                                  unwrap_model_for_generation)
from .stage3.init import Init, is_partitioned
from .stage3.stage import ShardedParameters
from .strategy import DEFAULT_BUCKET_NUMEL, ZeroStrategy

STRATEGIES = {0: DataParallel, 1: ShardedOptimizer, 2: ShardedGradients, 3: ShardedParameters}


def build_strategy(zero, module: torch.nn.Module, param_groups: list[dict], registration: dict[int, int],
                   comm: Comm, compute_dtype: torch.dtype, device, *, prescale_gradients: bool = False,
                   gradient_predivide_factor: float = 1.0, gradient_mean: bool = True,
                   accumulation_dtype: torch.dtype | None = None, optimizer_state_bytes: int = 8) -> ZeroStrategy:
    """`zero` is the validated zero_optimization block, every value in it the one in force
    (config/zero.py resolves the defaults); stage 3 writes back the two it derives from the model."""
    if zero.stage not in STRATEGIES:
        raise ConfigError(f"zero_optimization.stage: stage {zero.stage} is not available "
                          f"(available: {sorted(STRATEGIES)})")
    if zero.stage != 3 and any(is_partitioned(p) for g in param_groups for p in g["params"]):
        raise ConfigError("the model was built under zerotrain.zero.Init(), which partitions parameters "
                          "for ZeRO stage 3; set zero_optimization.stage to 3 or build it outside Init")
    offload = zero.offload_optimizer
    if offload is not None and offload.device != "none" and zero.stage == 0:
        raise ConfigError("zero_optimization.offload_optimizer: offloading needs ZeRO stage 1, 2 or 3; "
                          "set \"stage\" to 1 or more, or remove offload_optimizer")
    # offload_param below stage 3 is ignored, as DeepSpeed does; the notice at initialize names it
    kwargs = dict(bucket_numel=int(zero.reduce_bucket_size), prescale_gradients=prescale_gradients,
                  gradient_predivide_factor=gradient_predivide_factor, gradient_mean=gradient_mean,
                  overlap_comm=bool(zero.overlap_comm),
                  offload_optimizer=offload, offload_block_numel=int(zero.sub_group_size),
                  accumulation_dtype=accumulation_dtype, optimizer_state_bytes=optimizer_state_bytes)
    if zero.stage == 3:
        kwargs.update(module=module, offload_param=zero.offload_param, persistence_threshold=int(zero.param_persistence_threshold),
                      # None: zerotrain's default, sized by the strategy from the model
                      prefetch_numel=zero.prefetch_bucket_size, reuse_numel=zero.max_reuse_distance,
                      max_live_numel=int(zero.max_live_parameters))
    strategy = STRATEGIES[zero.stage](param_groups, registration, comm, compute_dtype, device, **kwargs)
    if zero.stage == 3:
        zero.settle_from_model(strategy.schedule.prefetch_numel, strategy.schedule.reuse_numel)
    return strategy
