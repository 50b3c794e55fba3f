"""Learning-rate schedules: HF-Trainer types and DeepSpeed's config schedulers.

`functional` holds every curve as a pure function of the step; `hf` and `deepspeed` are
thin, stateful wrappers that write those values into an optimizer's param groups.
"""

from .deepspeed import (
    LRRangeTest,
    OneCycle,
    WarmupCosineLR,
    WarmupDecayLR,
    WarmupLR,
    build_scheduler,
)
from .hf import SCHEDULER_TYPES, get_scheduler, resolve_warmup_steps

__all__ = [
    "SCHEDULER_TYPES",
    "LRRangeTest",
    "OneCycle",
    "WarmupCosineLR",
    "WarmupDecayLR",
    "WarmupLR",
    "build_scheduler",
    "get_scheduler",
    "resolve_warmup_steps",
]
