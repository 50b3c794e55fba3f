"""ZeRO: flat partitioned buffers (flat.py), gradient buckets (buckets.py) and one strategy
per stage over them. `build_strategy` picks the stage named in the config."""

from __future__ import annotations

import torch

from ..dist import Comm
from ..errors import ConfigError
from .stage0 import DEFAULT_BUCKET_NUMEL, DataParallel

STRATEGIES = {0: DataParallel}


def build_strategy(stage: int, param_groups: list[dict], registration: dict[int, int], comm: Comm,
                   compute_dtype: torch.dtype, device, *, bucket_numel: int | None = None,
                   prescale_gradients: bool = False, gradient_predivide_factor: float = 1.0):
    if stage not in STRATEGIES:
        raise ConfigError(f"zero_optimization.stage: stage {stage} is not available in this "
                          f"version of zerotrain (available: {sorted(STRATEGIES)}); set \"stage\": 0")
    return STRATEGIES[stage](param_groups, registration, comm, compute_dtype, device,
                             bucket_numel=bucket_numel or DEFAULT_BUCKET_NUMEL,
                             prescale_gradients=prescale_gradients,
                             gradient_predivide_factor=gradient_predivide_factor)
