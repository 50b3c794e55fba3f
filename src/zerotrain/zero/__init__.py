"""ZeRO: one strategy per stage (stage0.py .. stage3.py), each a `ZeroStrategy` (strategy.py,
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
from .gathered_parameters import GatheredParameters, register_external_parameter, unregister_external_parameter
from .partitioned_init import Init, is_partitioned
from .stage3 import ShardedParameters
from .strategy import DEFAULT_BUCKET_NUMEL, ZeroStrategy

# Stages 2-3 copy gradients into staging buffers (up to three buckets alive: two in flight, one
# filling), so their buckets cost memory that stage 0-1 buckets (views of a gradient buffer
# that exists anyway) do not: 8 MB of fp32 each, still few collectives per backward.
STAGED_BUCKET_NUMEL = 2**21
PREFETCH_KEYS = {"stage3_prefetch_bucket_size", "prefetch_bucket_size"}
REUSE_KEYS = {"stage3_max_reuse_distance", "max_reuse_distance"}
STRATEGIES = {0: DataParallel, 1: ShardedOptimizer, 2: ShardedGradients, 3: ShardedParameters}


def build_strategy(zero, module: torch.nn.Module, param_groups: list[dict], registration: dict[int, int],
                   comm: Comm, compute_dtype: torch.dtype, device, *, bucket_numel: int | None = None,
                   prescale_gradients: bool = False, gradient_predivide_factor: float = 1.0,
                   overlap_comm: bool = True, explicit: set[str] = frozenset()) -> ZeroStrategy:
    """`zero` is the validated zero_optimization block; `explicit` the keys the user wrote."""
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
    if zero.offload_param is not None and zero.offload_param.device != "none" and zero.stage != 3:
        raise ConfigError("zero_optimization.offload_param: parameter offload needs ZeRO stage 3; "
                          "set \"stage\": 3 or remove offload_param")
    if bucket_numel is None:
        bucket_numel = STAGED_BUCKET_NUMEL if zero.stage >= 2 else DEFAULT_BUCKET_NUMEL
    kwargs = dict(bucket_numel=bucket_numel, prescale_gradients=prescale_gradients,
                  gradient_predivide_factor=gradient_predivide_factor, overlap_comm=overlap_comm,
                  offload_optimizer=offload, offload_block_numel=int(zero.sub_group_size))
    if zero.stage == 3:
        kwargs.update(module=module, offload_param=zero.offload_param, persistence_threshold=int(zero.param_persistence_threshold),
                      # DeepSpeed's 5e7 default would prefetch a small model whole: unless set,
                      # look ahead by about two modules' worth instead
                      prefetch_numel=int(zero.prefetch_bucket_size) if explicit & PREFETCH_KEYS else None,
                      reuse_numel=int(zero.max_reuse_distance) if explicit & REUSE_KEYS else None,
                      max_live_numel=int(zero.max_live_parameters))
    return STRATEGIES[zero.stage](param_groups, registration, comm, compute_dtype, device, **kwargs)
