"""The gradient norm over the whole model when ranks hold different parts of it.

A ZeRO strategy's `grad_norm` covers the parameters of its data-parallel group. When other
ranks hold other parameters (pipeline stages, tensor slices), the clipping norm is

    norm^2 = sum over the model-parallel group of  strategy.grad_norm(counted parameters)^2

with every parameter counted once: a tied copy on a later stage, or a weight replicated on
tensor-parallel rank > 0, is left out where another rank counts it. Leaving out means its
gradient is zeroed for the strategy's norm and put back right after; stages 0 and 1 keep
gradients as views of their flat buffers, which is what makes that possible (stage 2 and 3
free them as they are reduced, so a parameter to leave out there is refused at setup).
A non-finite norm on any rank makes the sum non-finite everywhere, so every rank skips.
"""

from __future__ import annotations

import math

import torch

from ..errors import ConfigError


class ModelParallelNorm:
    """A strategy whose grad_norm spans `model_comm`; everything else is the strategy's own."""

    def __init__(self, strategy, model_comm, uncounted: list[torch.Tensor] = ()):
        self.inner = strategy
        self.model_comm = model_comm
        self.uncounted = list(uncounted)
        if self.uncounted and any(p.grad is None for p in self.uncounted):
            raise ConfigError(f"zero_optimization.stage {strategy.stage}: tied or replicated parameters across "
                              "model-parallel ranks need ZeRO stage 0 or 1 (their gradients must stay whole)")

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def grad_norm(self, loss_scale: float = 1.0) -> float:
        saved = [p.grad.clone() for p in self.uncounted]
        for p in self.uncounted:
            p.grad.zero_()
        try:
            local = self.inner.grad_norm(loss_scale)
        finally:
            for p, g in zip(self.uncounted, saved):
                p.grad.copy_(g)
        if self.model_comm.alone:
            return local
        squares = torch.tensor([local * local], dtype=torch.float64)
        self.model_comm.all_reduce(squares)
        return math.sqrt(squares.item())
