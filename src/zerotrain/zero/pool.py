"""Scratch buffers reused by size.

Stage 3 needs the same large temporaries every step (all-gather landing zones, gradient
bucket staging). Allocating and freeing them each time fragments the host heap (glibc keeps
the freed memory, so resident memory creeps up step after step) and costs page faults;
keeping the few that are in use at once and handing them out again avoids both.
"""

from __future__ import annotations

from collections import defaultdict

import torch


class BufferPool:
    def __init__(self, dtype: torch.dtype, device):
        self.dtype, self.device = dtype, device
        self._free: dict[int, list[torch.Tensor]] = defaultdict(list)

    def take(self, numel: int) -> torch.Tensor:
        free = self._free[numel]
        return free.pop() if free else torch.empty(numel, dtype=self.dtype, device=self.device)

    def give(self, buffer: torch.Tensor) -> None:
        self._free[buffer.numel()].append(buffer)
