"""The gradient norm over the whole model when ranks hold different parts of it.

A ZeRO strategy's `grad_norm` covers the parameters of its data-parallel group. When other
ranks hold other parameters (pipeline stages, tensor slices), the clipping norm is

    norm^2 = sum over the model-parallel group of  (this rank's counted gradients)^2

with every parameter counted once: a tied copy on a later stage, or a weight replicated on
tensor-parallel rank > 0, is left out where another rank counts it. What is counted is read
straight from the gradients the step reads (`reduced_grads`, this rank's piece of each flat
group: whole at stage 0, its data-parallel shard at 1 and 2) as the few contiguous ranges the
counted parameters cover there, so it works at every stage that lays gradients out flat and
changes no gradient. Every sum is float64 (zero.strategy.sum_of_squares), so the norm is the
same however the model is cut across ranks. A non-finite norm on any rank makes the sum
non-finite everywhere, so every rank skips.
"""

from __future__ import annotations

import math

import torch

from ..errors import ConfigError
from ..zero.strategy import sum_of_squares


def counted_ranges(groups, rank: int, uncounted_ids: set[int]) -> list[list[tuple[int, int]]]:
    """Per group, the [lo, hi) ranges of rank `rank`'s piece that hold counted parameters
    (adjacent ones merged, so there are few)."""
    out = []
    for fg in groups:
        ranges: list[tuple[int, int]] = []
        for span in fg.spans(rank):
            if id(fg.params[span.index]) in uncounted_ids:
                continue
            lo, hi = span.piece_lo, span.piece_lo + span.numel
            if ranges and ranges[-1][1] == lo:
                ranges[-1] = (ranges[-1][0], hi)
            else:
                ranges.append((lo, hi))
        out.append(ranges)
    return out


class ModelParallelNorm:
    """A strategy whose grad_norm spans `model_comm`; everything else is the strategy's own."""

    def __init__(self, strategy, model_comm, uncounted: list[torch.Tensor] = ()):
        self.inner = strategy
        self.model_comm = model_comm
        ids = {id(p) for p in uncounted}
        if ids and strategy.stage > 2:
            raise ConfigError(f"zero_optimization.stage {strategy.stage}: tied or replicated parameters across "
                              "model-parallel ranks need ZeRO stage 0, 1 or 2 (stage 3 does not lay gradients out flat)")
        self.ranges = counted_ranges(strategy.groups[: strategy.trained_groups], strategy.comm.rank, ids) \
            if ids else None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _counted_squares(self) -> torch.Tensor:
        """The sum of squares of the counted gradients over this rank's data-parallel group."""
        self.inner.take_assigned_grads()
        pieces = [g[lo:hi] for g, ranges in zip(self.inner.reduced_grads(), self.ranges) for lo, hi in ranges]
        squares = sum_of_squares(pieces)
        if self.inner.shards_optimizer:
            self.inner.comm.all_reduce(squares)
        return squares

    def grad_norm(self, loss_scale: float = 1.0) -> float:
        # every parameter counts where nothing is left out: the strategy's own sum
        squares = self.inner.grad_squares() if self.ranges is None else self._counted_squares()
        self.model_comm.all_reduce(squares)
        return math.sqrt(squares.item()) / loss_scale

    def full_state_dict(self, module: torch.nn.Module) -> dict:
        """Whole tensors: tensor-parallel pieces gathered (a collective over the tensor ranks)."""
        from .tensor.dtensor import full

        params = dict(module.named_parameters(remove_duplicate=False))  # the state dict's copies lose attributes
        with torch.no_grad():
            return {k: full(params.get(k, v)).detach() for k, v in self.inner.full_state_dict(module).items()}
