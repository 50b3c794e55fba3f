"""DeepSpeed's five lr schedulers, same names, parameters and defaults as its config block.

Each class only validates its parameters and writes `functional.*` values into the param
groups; `last_batch_iteration` is the whole state, so a checkpoint round trip is one int.
`build_scheduler` turns `"scheduler": {"type", "params"}` into one of these (or a torch
scheduler) and reports config mistakes as ConfigError naming the key.
"""

from __future__ import annotations

import inspect
import numbers
import warnings
from typing import Any

import torch
from torch.optim import Optimizer
from torch.optim import lr_scheduler as torch_sched

from ..errors import ConfigError, did_you_mean
from . import functional as F

_WARMUP_TYPES = ("log", "linear")
_BETA2 = 0.99  # DeepSpeed's OneCycle forces beta2 to this while cycling momentum


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _set(group: dict, key: str, value: float) -> None:
    # A tensor lr (used for capturable/compiled optimizers) must stay the same object.
    current = group.get(key)
    if isinstance(current, torch.Tensor):
        current.fill_(value)
    else:
        group[key] = value


class _DeepSpeedSchedule:
    """Shared step / state handling; subclasses provide `get_lr()`."""

    def __init__(self, optimizer: Optimizer, last_batch_iteration: int = -1):
        if not isinstance(optimizer, Optimizer) and not hasattr(optimizer, "param_groups"):
            raise TypeError(f"{type(optimizer).__name__} is not an optimizer")
        self.optimizer = optimizer
        self.last_batch_iteration = last_batch_iteration

    def _per_group(self, value: Any, name: str) -> list:
        n = len(self.optimizer.param_groups)
        if isinstance(value, (list, tuple)):
            if len(value) != n:
                raise ValueError(f"{name}: expected {n} values (one per param group), got {len(value)}")
            return list(value)
        return [value] * n

    @staticmethod
    def _warmup_steps(warmup_num_steps: Any) -> int:
        if not _is_int(warmup_num_steps) or warmup_num_steps <= 0:
            raise ValueError(f"warmup_num_steps: must be an int > 0, got {warmup_num_steps!r}")
        return max(2, int(warmup_num_steps))

    @staticmethod
    def _warmup_type(warmup_type: str) -> str:
        if warmup_type not in _WARMUP_TYPES:
            warnings.warn(f"warmup_type: unknown {warmup_type!r}, using 'log'", stacklevel=3)
            return "log"
        return warmup_type

    def _write_initial(self) -> None:
        if self.last_batch_iteration == -1:
            self._write(self.get_lr())

    def _write(self, lrs: list[float]) -> None:
        for group, lr in zip(self.optimizer.param_groups, lrs):
            _set(group, "lr", lr)
        self._last_lr = list(lrs)

    def get_lr(self) -> list[float]:
        raise NotImplementedError

    def get_last_lr(self) -> list[float]:
        if not hasattr(self, "_last_lr"):
            raise AssertionError("get_last_lr() called before the scheduler wrote any lr; call step() first")
        return self._last_lr

    def step(self, it: int | None = None) -> None:
        self.last_batch_iteration = self.last_batch_iteration + 1 if it is None else it
        self._write(self.get_lr())

    def state_dict(self) -> dict:
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state: dict) -> None:
        self.last_batch_iteration = state["last_batch_iteration"]


class LRRangeTest(_DeepSpeedSchedule):
    """Linear (or staircase) lr growth to find the largest lr that still trains."""

    def __init__(
        self,
        optimizer: Optimizer,
        lr_range_test_min_lr: float | list = 1e-3,
        lr_range_test_step_size: int = 2000,
        lr_range_test_step_rate: float = 1.0,
        lr_range_test_staircase: bool = False,
        last_batch_iteration: int = -1,
    ):
        super().__init__(optimizer, last_batch_iteration)
        if not _is_int(lr_range_test_step_size) or lr_range_test_step_size <= 0:
            raise ValueError(f"lr_range_test_step_size: must be an int > 0, got {lr_range_test_step_size!r}")
        self.min_lr = self._per_group(lr_range_test_min_lr, "lr_range_test_min_lr")
        self.step_size = int(lr_range_test_step_size)
        self.step_rate = lr_range_test_step_rate
        self.staircase = bool(lr_range_test_staircase)
        self._write_initial()

    def get_lr(self) -> list[float]:
        it = self.last_batch_iteration
        return [F.lr_range_test_lr(it, m, self.step_size, self.step_rate, self.staircase) for m in self.min_lr]


class OneCycle(_DeepSpeedSchedule):
    """1-cycle policy: lr up then down (momentum mirrored), then an optional decay phase."""

    def __init__(
        self,
        optimizer: Optimizer,
        cycle_min_lr: float | list,
        cycle_max_lr: float | list,
        decay_lr_rate: float = 0.0,
        cycle_first_step_size: int = 2000,
        cycle_second_step_size: int | None = None,
        cycle_first_stair_count: int = 0,
        cycle_second_stair_count: int | None = None,
        decay_step_size: int = 0,
        cycle_momentum: bool = True,
        cycle_min_mom: float | list = 0.8,
        cycle_max_mom: float | list = 0.9,
        decay_mom_rate: float = 0.0,
        last_batch_iteration: int = -1,
    ):
        super().__init__(optimizer, last_batch_iteration)
        first = cycle_first_step_size
        second = first if cycle_second_step_size is None else cycle_second_step_size
        if first is None or first <= 0:
            raise ValueError(f"cycle_first_step_size: must be > 0, got {first!r}")
        if second < 0:
            raise ValueError(f"cycle_second_step_size: must be >= 0, got {second!r}")
        first_stairs = cycle_first_stair_count
        second_stairs = first_stairs if cycle_second_stair_count is None else cycle_second_stair_count
        for key, count in (("cycle_first_stair_count", first_stairs), ("cycle_second_stair_count", second_stairs)):
            if not _is_int(count) or count < 0:
                raise ValueError(f"{key}: must be an int >= 0, got {count!r}")
        if decay_step_size < 0:
            raise ValueError(f"decay_step_size: must be >= 0, got {decay_step_size!r}")
        self.first, self.second = first, second
        self.first_stairs, self.second_stairs = first_stairs, second_stairs
        self.min_lrs = self._per_group(cycle_min_lr, "cycle_min_lr")
        self.max_lrs = self._per_group(cycle_max_lr, "cycle_max_lr")
        self.decay_lr_rate = decay_lr_rate
        self.decay_step_size = decay_step_size
        self.min_moms = self._per_group(cycle_min_mom, "cycle_min_mom")
        self.max_moms = self._per_group(cycle_max_mom, "cycle_max_mom")
        self.decay_mom_rate = decay_mom_rate
        self.cycle_momentum = bool(cycle_momentum)
        if self.cycle_momentum and "betas" not in getattr(optimizer, "defaults", {}):
            warnings.warn(
                f"OneCycle: {type(optimizer).__name__} has no `betas`, so momentum is not cycled",
                stacklevel=2,
            )
            self.cycle_momentum = False
        if last_batch_iteration == -1:
            # DeepSpeed starts beta1 at min_mom (not max); the first step() moves it onto the cycle.
            self._write(list(self.min_lrs))
            if self.cycle_momentum:
                self._write_betas(self.min_moms)

    def _shape(self) -> tuple:
        return (self.first, self.second, self.first_stairs, self.second_stairs)

    @property
    def step_ratio(self) -> float:
        """DeepSpeed's name for the rising half's share of the cycle (1.0 with no second half)."""
        return self.first / (self.first + self.second)

    def get_lr(self) -> list[float]:
        it = self.last_batch_iteration
        return [
            F.one_cycle_lr(it, lo, hi, *self._shape(), self.decay_lr_rate, self.decay_step_size)
            for lo, hi in zip(self.min_lrs, self.max_lrs)
        ]

    def get_mom(self) -> list[tuple[float, float]] | None:
        """(beta1, 0.99) per group at the current iteration, or None when not cycling."""
        if not self.cycle_momentum:
            return None
        it = self.last_batch_iteration
        return [
            (F.one_cycle_mom(it, lo, hi, *self._shape(), self.decay_mom_rate, self.decay_step_size), _BETA2)
            for lo, hi in zip(self.min_moms, self.max_moms)
        ]

    def _write_betas(self, beta1s: list[float]) -> None:
        for group, beta1 in zip(self.optimizer.param_groups, beta1s):
            betas = group.get("betas")
            if betas is not None and isinstance(betas[0], torch.Tensor):
                betas[0].fill_(beta1)
                if isinstance(betas[1], torch.Tensor):
                    betas[1].fill_(_BETA2)
                    continue
                group["betas"] = (betas[0], _BETA2)
            else:
                group["betas"] = (beta1, _BETA2)

    def step(self, it: int | None = None) -> None:
        super().step(it)
        if self.cycle_momentum:
            self._write_betas([m for m, _ in self.get_mom()])


class WarmupLR(_DeepSpeedSchedule):
    """Log or linear warmup from min to max, then flat; max defaults to each group's own lr."""

    def __init__(
        self,
        optimizer: Optimizer,
        warmup_min_lr: float | list = 0.0,
        warmup_max_lr: float | list | None = None,
        warmup_num_steps: int = 1000,
        warmup_type: str = "log",
        last_batch_iteration: int = -1,
    ):
        super().__init__(optimizer, last_batch_iteration)
        self.warmup_num_steps = self._warmup_steps(warmup_num_steps)
        self.warmup_type = self._warmup_type(warmup_type)
        self.min_lrs = self._per_group(warmup_min_lr, "warmup_min_lr")
        if warmup_max_lr is None:
            self.max_lrs = [float(g["lr"]) for g in optimizer.param_groups]
        else:
            self.max_lrs = self._per_group(warmup_max_lr, "warmup_max_lr")
        self._write_initial()

    def get_lr(self) -> list[float]:
        it = self.last_batch_iteration
        return [
            F.warmup_lr(it, lo, hi, self.warmup_num_steps, self.warmup_type)
            for lo, hi in zip(self.min_lrs, self.max_lrs)
        ]


class WarmupDecayLR(WarmupLR):
    """WarmupLR, then linear decay back to min at `total_num_steps`. Max defaults to 0.001."""

    def __init__(
        self,
        optimizer: Optimizer,
        total_num_steps: int,
        warmup_min_lr: float | list = 0.0,
        warmup_max_lr: float | list = 0.001,
        warmup_num_steps: int = 1000,
        warmup_type: str = "log",
        last_batch_iteration: int = -1,
    ):
        if total_num_steps is None or isinstance(total_num_steps, bool) or total_num_steps < 0:
            raise ValueError(f"total_num_steps: must be a number >= 0, got {total_num_steps!r}")
        self.total_num_steps = total_num_steps
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type, last_batch_iteration)
        if self.total_num_steps < self.warmup_num_steps:
            warnings.warn(
                f"WarmupDecayLR: total_num_steps ({total_num_steps}) < warmup_num_steps "
                f"({self.warmup_num_steps}); the lr drops to min right after warmup",
                stacklevel=2,
            )

    def get_lr(self) -> list[float]:
        it = self.last_batch_iteration
        return [
            F.warmup_decay_lr(it, lo, hi, self.warmup_num_steps, self.total_num_steps, self.warmup_type)
            for lo, hi in zip(self.min_lrs, self.max_lrs)
        ]


class WarmupCosineLR(_DeepSpeedSchedule):
    """Warmup then cosine decay, as ratios of each group's lr at construction (0 until step)."""

    def __init__(
        self,
        optimizer: Optimizer,
        total_num_steps: int,
        warmup_min_ratio: float = 0.0,
        warmup_num_steps: int = 1000,
        cos_min_ratio: float = 0.0001,
        warmup_type: str = "log",
        last_batch_iteration: int = -1,
    ):
        super().__init__(optimizer, last_batch_iteration)
        if total_num_steps is None or isinstance(total_num_steps, bool) or total_num_steps < 0:
            raise ValueError(f"total_num_steps: must be a number >= 0, got {total_num_steps!r}")
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = self._warmup_steps(warmup_num_steps)
        self.warmup_type = self._warmup_type(warmup_type)
        self.warmup_min_ratio = warmup_min_ratio
        self.cos_min_ratio = cos_min_ratio
        self.org_lrs = [float(g["lr"]) for g in optimizer.param_groups]
        self._write_initial()

    def get_lr_ratio(self) -> float:
        return F.warmup_cosine_ratio(
            self.last_batch_iteration,
            self.warmup_num_steps,
            self.total_num_steps,
            self.warmup_min_ratio,
            self.cos_min_ratio,
            self.warmup_type,
        )

    def get_lr(self) -> list[float]:
        ratio = self.get_lr_ratio()
        return [lr * ratio for lr in self.org_lrs]


DEEPSPEED_SCHEDULERS = {cls.__name__: cls for cls in (LRRangeTest, OneCycle, WarmupLR, WarmupDecayLR, WarmupCosineLR)}


def _torch_schedulers() -> dict[str, type]:
    return {
        name: obj
        for name, obj in vars(torch_sched).items()
        if isinstance(obj, type)
        and not name.startswith("_")
        and issubclass(obj, (torch_sched.LRScheduler, torch_sched.ReduceLROnPlateau))
        and obj is not torch_sched.LRScheduler
    }


def _lookup(type_name: Any) -> type:
    if not isinstance(type_name, str):
        raise ConfigError(f"scheduler.type: expected a string, got {type_name!r}")
    if type_name in DEEPSPEED_SCHEDULERS:
        return DEEPSPEED_SCHEDULERS[type_name]
    for name, cls in DEEPSPEED_SCHEDULERS.items():
        if name.lower() == type_name.lower():
            return cls
    torch_classes = _torch_schedulers()
    if type_name in torch_classes:
        return torch_classes[type_name]
    hint = did_you_mean(type_name, [*DEEPSPEED_SCHEDULERS, *torch_classes])
    raise ConfigError(f"scheduler.type: unknown scheduler {type_name!r}{hint}")


def build_scheduler(type_name: str, optimizer: Optimizer, params: dict | None):
    """The `"scheduler": {"type", "params"}` config block -> a scheduler object.
    `warmup_num_steps: 0` means no warmup (what HF's "auto" gives with no warmup steps);
    DeepSpeed's classes, built directly, refuse it as DeepSpeed does."""
    cls = _lookup(type_name)
    params = {} if params is None else params
    if not isinstance(params, dict):
        raise ConfigError(f"scheduler.params: expected an object, got {type(params).__name__}")
    # Checked against the signature up front: a TypeError from inside a constructor would
    # be indistinguishable from a bug.
    accepted = list(inspect.signature(cls).parameters.values())[1:]
    names = [p.name for p in accepted if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    open_kwargs = any(p.kind is p.VAR_KEYWORD for p in accepted)
    for key in params:
        if key not in names and not open_kwargs:
            raise ConfigError(f"scheduler.params.{key}: unknown key{did_you_mean(key, names)}")
    for p in accepted:
        if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in params:
            raise ConfigError(f"scheduler.params.{p.name}: required by {cls.__name__}")
    no_warmup = cls in (WarmupLR, WarmupDecayLR, WarmupCosineLR) and params.get("warmup_num_steps") == 0 \
        and _is_int(params.get("warmup_num_steps"))
    if no_warmup:  # the trainer's "auto" with no warmup; DeepSpeed's classes refuse 0
        params = {**params, "warmup_num_steps": 1}
    try:
        with warnings.catch_warnings():
            if no_warmup:  # total < the stand-in warmup: a warmup the config does not have
                warnings.filterwarnings("ignore", message=r"WarmupDecayLR: total_num_steps")
            scheduler = cls(optimizer, **params)
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:
        raise ConfigError(f"scheduler.params: {err}") from err
    if no_warmup:
        # W = 0: every formula of functional.py is then past its warmup from the first step
        scheduler.warmup_num_steps = 0
        scheduler._write_initial()
    return scheduler
