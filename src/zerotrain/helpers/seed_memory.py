"""Seeding every random number generator a training script meets, and a one-line memory report."""

from __future__ import annotations

import gc
import random

import numpy as np

from ..comm import facade
from .accelerator import CPU_Accelerator, get_accelerator
from .logs import logger


def set_random_seed(seed: int) -> None:
    """Seed Python's `random`, numpy's global generator, torch's CPU generator and the
    accelerator's generators on every device."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    acc = get_accelerator()
    acc.manual_seed(seed)
    acc.manual_seed_all(seed)
    CPU_Accelerator().manual_seed(seed)


def see_memory_usage(message: str, force: bool = False) -> str | None:
    """With `force`, log on rank 0 the device memory allocated and reserved (now and peak, GiB)
    and the host's memory in use, then reset the peaks; returns the line (None when not
    logged). Without `force` it does nothing, as DeepSpeed's."""
    if not force or facade.get_rank() != 0:
        return None
    gc.collect()
    acc, host = get_accelerator(), CPU_Accelerator()
    gib = 2**30
    used = host.total_memory() - host.available_memory()
    line = (f"{message} | MA {acc.memory_allocated() / gib:.2f} GB | Max_MA {acc.max_memory_allocated() / gib:.2f} GB"
            f" | CA {acc.memory_reserved() / gib:.2f} GB | Max_CA {acc.max_memory_reserved() / gib:.2f} GB"
            f" | CPU used {used / gib:.2f} GB ({100 * used / host.total_memory():.1f}%)")
    logger.info(line)
    acc.reset_peak_memory_stats()
    return line
