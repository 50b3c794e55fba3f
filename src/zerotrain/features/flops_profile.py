"""The config's `flops_profiler` block: one training forward profiled on rank 0.

At the first forward of optimizer step `profile_step` (engine.global_steps), rank 0 counts the
forward's FLOPs with torch's FlopCounterMode and times it, then logs (or writes to
`output_file`) the same report as zerotrain.profiling.flops_profiler.get_model_profile: the
parameters, MACs, FLOPs and latency, per module to `module_depth`. The count ends when the
model's forward returns (a forward hook), so backward is not in it; other ranks and steps run
untouched.
"""

from __future__ import annotations

import logging
import time

from torch.utils.flop_counter import FlopCounterMode

from ..engine.hooks import EngineFeature
from ..helpers.accelerator import get_accelerator
from ..helpers.flops import report

log = logging.getLogger("zerotrain")


class FlopsProfileFeature(EngineFeature):
    name = "flops_profiler"

    def __init__(self, block):
        self.block = block
        self.done = False
        self._open = None  # (counter, hook handle) while a forward is being counted

    def before_forward(self, engine, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if self.done or engine.global_steps != self.block.profile_step or engine.comm.global_rank != 0:
            return args, kwargs
        self.done = True
        counter = FlopCounterMode(display=False)
        get_accelerator().synchronize()
        start = time.perf_counter()
        counter.__enter__()

        def finish(module, inputs, output) -> None:
            get_accelerator().synchronize()
            self._close()
            self._write(module, counter, time.perf_counter() - start)

        self._open = (counter, engine.module.register_forward_hook(finish))
        return args, kwargs

    def on_boundary(self, engine) -> None:
        self._close()  # a forward that never reached the hook (an engine that calls submodules)

    def _close(self) -> None:
        if self._open is not None:
            counter, handle = self._open
            self._open = None
            handle.remove()
            counter.__exit__(None, None, None)

    def _write(self, module, counter: FlopCounterMode, latency: float) -> None:
        b = self.block
        text = report(module, counter.get_flop_counts(), counter.get_total_flops(), b.module_depth, b.top_modules,
                      latency, b.detailed)
        if b.output_file:
            with open(b.output_file, "w") as f:
                f.write(text + "\n")
        else:
            log.info(f"flops profile of step {b.profile_step}:\n{text}")
