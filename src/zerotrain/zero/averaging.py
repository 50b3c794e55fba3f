"""Where the division by the world size of a gradient mean happens, and the gradient scaling
the optimizer step needs (unscale x clip), shared by every ZeRO stage."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Averaging:
    """Where a gradient mean's division by the world size happens: `in_loss` is folded into
    the loss the engine back-propagates (free: no pass over the gradients), `before` scales a
    bucket ahead of the sum, `after` the sum."""

    in_loss: float = 1.0
    before: float = 1.0
    after: float = 1.0

    def scale_before_sum(self, grads: torch.Tensor) -> None:
        if self.before != 1.0:
            grads.mul_(self.before)

    def scale_after_sum(self, grads: torch.Tensor) -> None:
        if self.after != 1.0:
            grads.mul_(self.after)

    def add_sum_into(self, acc: torch.Tensor, summed: torch.Tensor) -> None:
        """acc += the scaled sum. The copy to acc's device blocks: an offloaded acc is read by
        the CPU at once, and an asynchronous copy out of a GPU could still be in flight."""
        acc.add_(summed.to(acc.device), alpha=self.after)


def plan_averaging(world_size: int, prescale: bool, predivide: float, dtype: torch.dtype,
                   mean: bool = True) -> Averaging:
    """fp16: where the spec says (prescale_gradients, gradient_predivide_factor), for that
    choice guards its narrow range. fp32 and bf16 have range to spare, so the whole 1/N goes
    into the loss: no pass over the gradients for it, and for a power-of-two world size the
    very numbers that dividing after the sum gives. mean=False (gradient_allreduce_op "sum")
    leaves the sum: the same plan with a divisor of 1."""
    if not mean:
        world_size = 1
    if dtype != torch.float16:
        return Averaging(in_loss=1.0 / world_size)
    if prescale:
        return Averaging(before=1.0 / world_size)
    return Averaging(before=1.0 / predivide, after=predivide / world_size)


def attach_and_scale(masters: list[torch.Tensor], grads: list[torch.Tensor], coef: float) -> None:
    """Give each master its gradient again (a user's optimizer.zero_grad() may have set it to
    None) and multiply all of them by coef (1/loss scale x clip) in one foreach kernel."""
    for master, grad in zip(masters, grads):
        master.grad = grad
    if coef != 1.0:
        torch._foreach_mul_(grads, coef)
