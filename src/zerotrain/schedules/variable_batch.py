"""The learning rate of a step scaled by how many samples the step holds (dynamic batching).

The reference batch size is DeepSpeed's: train_batch_size (micro x accumulation x data-
parallel ranks), the batch the configured LR was chosen for. A step of n samples trains at

    linear   lr = base_lr * n / train_batch_size         (Goyal et al., 2017)
    sqrt     lr = base_lr * sqrt(n / train_batch_size)   (Krizhevsky, 2014)
    none     lr = base_lr

where base_lr is what the underlying schedule (or the optimizer's constant LR) gives for that
step. The wrapper keeps the unscaled values and writes them back before the underlying
schedule steps, so schedules that multiply the current LR (torch's StepLR, say) never
compound a scale.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

from ..errors import ConfigError

log = logging.getLogger("zerotrain")
METHODS = ("linear", "sqrt", "none")


def scale_lr(base_batch_size: int, batch_size: int, base_lr: float = 1.0, method: str | None = "linear") -> float:
    """DeepSpeed's function: the LR of a step of batch_size samples (module docstring)."""
    if method is None or str(method).lower() == "none":
        return base_lr
    if method == "linear":
        return base_lr * batch_size / base_batch_size
    if method == "sqrt":
        return base_lr * math.sqrt(batch_size / base_batch_size)
    raise ConfigError(f"lr_scaling_method {method!r} is not one of {', '.join(METHODS)}")


class _ConstantLR:
    """The base schedule of an optimizer without one: its LRs as they are."""

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def step(self, *args, **kwargs) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class VariableBatchSizeLR:
    """Scales the LR its base schedule sets by the size of the step about to run.

    batch_sizes: a list (indexed by step modulo its length, as DeepSpeed does) or a function
    step -> samples. `step()` steps the base schedule and moves to the next step's size;
    `align(step)` sets the scale for a given step without stepping the base (the engine's
    dynamic-batching feature calls it before every optimizer step, so a skipped step, whose
    schedule does not advance, still trains at its own batch's scale)."""

    def __init__(self, lr_scheduler, base_batch_size: int, batch_sizes: Sequence[int] | Callable[[int], int],
                 dataloader=None, lr_scaling_method: str = "linear", last_epoch: int = -1, verbose: bool = False):
        self.base_lr_scheduler = lr_scheduler
        self.base_batch_size, self.lr_scaling_method = base_batch_size, lr_scaling_method
        self.batch_sizes, self.dataloader, self.verbose = batch_sizes, dataloader, verbose
        scale_lr(1, 1, 1.0, lr_scaling_method)  # an unknown method fails here, not at the first step
        self.unscaled = [float(g["lr"]) for g in self.optimizer.param_groups]
        self.last_epoch = max(last_epoch, 0)  # the step whose batch the LR in the groups is for
        self._apply()

    @property
    def optimizer(self):
        return self.base_lr_scheduler.optimizer

    def size_of(self, step: int) -> int:
        if callable(self.batch_sizes):
            return int(self.batch_sizes(step))
        return int(self.batch_sizes[step % len(self.batch_sizes)])

    def _apply(self) -> None:
        n = self.size_of(self.last_epoch)
        for group, lr in zip(self.optimizer.param_groups, self.unscaled):
            group["lr"] = scale_lr(self.base_batch_size, n, lr, self.lr_scaling_method)
        if self.verbose:
            log.info("dynamic batching: step %d holds %d samples (reference %d): lr %s -> %s", self.last_epoch, n,
                     self.base_batch_size, self.unscaled, self.get_lr())

    def step(self, epoch: int | None = None, **kwargs) -> None:
        for group, lr in zip(self.optimizer.param_groups, self.unscaled):
            group["lr"] = lr  # the base schedule steps from its own, unscaled values
        if epoch is None:
            self.base_lr_scheduler.step(**kwargs)
        else:
            self.base_lr_scheduler.step(epoch, **kwargs)
        self.unscaled = [float(g["lr"]) for g in self.optimizer.param_groups]
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch
        self._apply()

    def align(self, step: int) -> None:
        if step != self.last_epoch:
            self.last_epoch = step
            self._apply()

    def get_lr(self) -> list[float]:
        """The LRs in effect: scaled."""
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    get_last_lr = get_lr

    def state_dict(self) -> dict:
        return {"base_lr_scheduler": self.base_lr_scheduler.state_dict(), "base_batch_size": self.base_batch_size,
                "lr_scaling_method": self.lr_scaling_method, "unscaled": list(self.unscaled),
                "last_epoch": self.last_epoch}

    def load_state_dict(self, state: dict) -> None:
        self.base_lr_scheduler.load_state_dict(state["base_lr_scheduler"])
        self.base_batch_size, self.lr_scaling_method = state["base_batch_size"], state["lr_scaling_method"]
        self.unscaled, self.last_epoch = list(state["unscaled"]), state["last_epoch"]
        self._apply()


def lr_scheduler_for_variable_batch_size(base_batch_size: int, batch_sizes, dataloader, lr_scheduler_or_optimizer,
                                         lr_scaling_method: str = "linear", verbose: bool = False) -> VariableBatchSizeLR:
    """DeepSpeed's function: wrap a schedule (anything with .optimizer) or an optimizer (its
    constant LRs) so that every step's LR is scaled by that step's samples."""
    given = lr_scheduler_or_optimizer
    if hasattr(given, "param_groups"):  # an optimizer (torch's, or one of zerotrain's wrappers)
        base = _ConstantLR(given)
    elif hasattr(getattr(given, "optimizer", None), "param_groups"):
        base = given
    else:
        raise ConfigError(f"dynamic batching scales the LR of an optimizer or a schedule with .optimizer; got "
                          f"{type(given).__name__}")
    return VariableBatchSizeLR(base, base_batch_size, batch_sizes, dataloader, lr_scaling_method, verbose=verbose)
