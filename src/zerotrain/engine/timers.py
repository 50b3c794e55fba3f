"""Wall-clock breakdown of forward / backward / step, as `wall_clock_breakdown` asks."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch


class Timers:
    def __init__(self, enabled: bool, device):
        self.enabled = enabled
        self.cuda = torch.device(device).type == "cuda"
        self.total = defaultdict(float)
        self.count = defaultdict(int)

    @contextmanager
    def __call__(self, name: str):
        if not self.enabled:
            yield
            return
        if self.cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        yield
        if self.cuda:
            torch.cuda.synchronize()
        self.total[name] += time.perf_counter() - start
        self.count[name] += 1

    def summary_and_reset(self) -> str:
        """'forward=12.3ms backward=20.1ms step=3.0ms' (mean per call since last summary)."""
        parts = [f"{k}={1000 * self.total[k] / self.count[k]:.1f}ms" for k in ("forward", "backward", "pipeline", "reduce", "step")
                 if self.count[k]]
        self.total.clear()
        self.count.clear()
        return " ".join(parts)
