"""Learning-rate schedules as pure functions of the step.

Everything numeric about a schedule lives here, so the spec tests can pin each curve
without an optimizer, and the scheduler classes in `hf.py` / `deepspeed.py` stay thin.

Two step conventions meet in this file (see the spec, section 3):

* HF multipliers take `step` = number of scheduler.step() calls so far; step 0 is the
  value right after construction. The lr is `group_initial_lr * f(step)`.
* DeepSpeed functions take `it` = `last_batch_iteration`, which is -1 at construction
  and 0 after the first step().
"""

from __future__ import annotations

import math

# ---------------------------------------------------------------------------------------
# HF transformers multipliers (LambdaLR factors)


def hf_linear_warmup(step: int, num_warmup_steps: int) -> float:
    """The ramp shared by most HF schedules while step < W."""
    return float(step) / float(max(1, num_warmup_steps))


def linear_multiplier(step: int, num_warmup_steps: int, num_training_steps: int) -> float:
    if step < num_warmup_steps:
        return hf_linear_warmup(step, num_warmup_steps)
    return max(0.0, float(num_training_steps - step) / float(max(1, num_training_steps - num_warmup_steps)))


def _cosine_progress(step: int, num_warmup_steps: int, num_training_steps: int) -> float:
    return float(step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))


def cosine_multiplier(
    step: int, num_warmup_steps: int, num_training_steps: int, num_cycles: float = 0.5
) -> float:
    # Progress is deliberately not clamped: past N the half-cycle curve rises again (HF does this).
    if step < num_warmup_steps:
        return hf_linear_warmup(step, num_warmup_steps)
    p = _cosine_progress(step, num_warmup_steps, num_training_steps)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 2.0 * float(num_cycles) * p)))


def cosine_with_restarts_multiplier(
    step: int, num_warmup_steps: int, num_training_steps: int, num_cycles: float = 1.0
) -> float:
    if step < num_warmup_steps:
        return hf_linear_warmup(step, num_warmup_steps)
    p = _cosine_progress(step, num_warmup_steps, num_training_steps)
    if p >= 1.0:
        return 0.0
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * ((float(num_cycles) * p) % 1.0))))


def polynomial_multiplier(
    step: int,
    num_warmup_steps: int,
    num_training_steps: int,
    lr_init: float,
    lr_end: float = 1e-7,
    power: float = 1.0,
) -> float:
    if step < num_warmup_steps:
        return hf_linear_warmup(step, num_warmup_steps)
    decay_steps = num_training_steps - num_warmup_steps
    # HF divides by zero when N == W; we read a zero-length decay as already finished.
    if step > num_training_steps or decay_steps <= 0:
        return lr_end / lr_init
    remaining = 1.0 - float(step - num_warmup_steps) / float(decay_steps)
    return ((lr_init - lr_end) * remaining**power + lr_end) / lr_init


def constant_multiplier(step: int) -> float:
    return 1.0


def constant_with_warmup_multiplier(step: int, num_warmup_steps: int) -> float:
    if step < num_warmup_steps:
        return float(step) / max(1.0, float(num_warmup_steps))
    return 1.0


def default_timescale(num_warmup_steps: int) -> float:
    """inverse_sqrt's timescale when none is given: W, or 10000 when there is no warmup."""
    return num_warmup_steps or 10_000


def inverse_sqrt_multiplier(step: int, num_warmup_steps: int, timescale: float) -> float:
    if step < num_warmup_steps:
        return hf_linear_warmup(step, num_warmup_steps)
    shift = timescale - num_warmup_steps
    return 1.0 / math.sqrt((step + shift) / timescale)


def cosine_with_min_lr_multiplier(
    step: int,
    num_warmup_steps: int,
    num_training_steps: int,
    min_lr_rate: float,
    num_cycles: float = 0.5,
) -> float:
    if step < num_warmup_steps:
        return hf_linear_warmup(step, num_warmup_steps)
    p = _cosine_progress(step, num_warmup_steps, num_training_steps)
    f = 0.5 * (1.0 + math.cos(math.pi * 2.0 * float(num_cycles) * p))
    return max(0.0, f * (1.0 - min_lr_rate) + min_lr_rate)


def cosine_warmup_with_min_lr_multiplier(
    step: int,
    num_warmup_steps: int,
    num_training_steps: int,
    min_lr_rate: float,
    num_cycles: float = 0.5,
    warmup_lr_rate: float | None = None,
) -> float:
    # Shifted by one step against `cosine_with_min_lr`, so step 0 already has a non-zero lr.
    if step < num_warmup_steps:
        if warmup_lr_rate is None:
            return (step + 1.0) / max(1.0, float(num_warmup_steps))
        w = float(warmup_lr_rate)
        return w + (1.0 - w) * float(step) / max(1.0, float(num_warmup_steps - 1))
    p = float(step - num_warmup_steps + 1) / float(max(1, num_training_steps - num_warmup_steps))
    f = 0.5 * (1.0 + math.cos(math.pi * 2.0 * float(num_cycles) * p))
    return max(0.0, f * (1.0 - min_lr_rate) + min_lr_rate)


WSD_CURVES = ("linear", "cosine", "1-sqrt")


def warmup_stable_decay_multiplier(
    step: int,
    num_warmup_steps: int,
    num_stable_steps: int,
    num_decay_steps: int,
    warmup_type: str = "linear",
    decay_type: str = "cosine",
    min_lr_ratio: float = 0.0,
    num_cycles: float = 0.5,
) -> float:
    w, s, d, m = num_warmup_steps, num_stable_steps, num_decay_steps, float(min_lr_ratio)
    if step < w:
        p = float(step) / float(max(1, w))
        if warmup_type == "linear":
            f = p
        elif warmup_type == "cosine":
            f = 0.5 * (1.0 - math.cos(math.pi * p))
        elif warmup_type == "1-sqrt":
            f = 1.0 - math.sqrt(1.0 - p)
        else:
            raise ValueError(f"warmup_type: unknown {warmup_type!r}, expected one of {WSD_CURVES}")
        return f * (1.0 - m) + m
    if step < w + s:
        return 1.0
    if step < w + s + d:
        p = float(step - w - s) / float(max(1, d))
        if decay_type == "linear":
            f = 1.0 - p
        elif decay_type == "cosine":
            f = 0.5 * (1.0 + math.cos(math.pi * 2.0 * float(num_cycles) * p))
        elif decay_type == "1-sqrt":
            f = 1.0 - math.sqrt(p)
        else:
            raise ValueError(f"decay_type: unknown {decay_type!r}, expected one of {WSD_CURVES}")
        return f * (1.0 - m) + m
    return m


def warmup_linear_decay_exp_multiplier(
    step: int, num_training_steps: int, warmup: float, decay_rate: float = 0.99, decay_steps: float = 1000
) -> float:
    """The BERT PLD recipe's "warmup linear decay exp" (spec 9.2), with warmup the fraction w of
    the T total steps: (s/T)/w while s/T < w, then decay_rate ** ((s - w*T) / decay_steps).
    A warmup of 0 gives 1 at every step, with no decay at all: the recipe returns 1 before it
    looks at the decay rate, and zerotrain keeps that so its numbers carry over."""
    if warmup == 0:
        return 1.0
    x = step / num_training_steps
    if x < warmup:
        return x / warmup
    return decay_rate ** ((step - warmup * num_training_steps) / decay_steps)


# ---------------------------------------------------------------------------------------
# DeepSpeed schedules (functions of last_batch_iteration `it`)


def ds_warmup_gamma(it: int, warmup_num_steps: int, warmup_type: str = "log") -> float:
    """Fraction of the warmup done at `it`; `warmup_num_steps` is already max(2, n)."""
    if it < 0:
        return 0.0
    if it < warmup_num_steps:
        if warmup_type == "linear":
            return it / warmup_num_steps
        return math.log(it + 1) / math.log(warmup_num_steps)
    return 1.0


# warmup_num_steps == 0 below (reachable only through build_scheduler: DeepSpeed's classes
# refuse 0) means no warmup: the first optimizer step (it == -1) is already at the peak, and a
# decay runs over total_num_steps steps from there, as HF's schedules do with no warmup.


def warmup_lr(it: int, min_lr: float, max_lr: float, warmup_num_steps: int, warmup_type: str = "log") -> float:
    gamma = 1.0 if warmup_num_steps == 0 else ds_warmup_gamma(it, warmup_num_steps, warmup_type)
    return min_lr + (max_lr - min_lr) * gamma


def warmup_decay_lr(
    it: int,
    min_lr: float,
    max_lr: float,
    warmup_num_steps: int,
    total_num_steps: int,
    warmup_type: str = "log",
) -> float:
    if warmup_num_steps == 0:
        gamma = max(0.0, (total_num_steps - it - 1) / max(1, total_num_steps))
    elif it < warmup_num_steps:
        gamma = ds_warmup_gamma(it, warmup_num_steps, warmup_type)
    else:
        # Clamped at 0, so the lr parks at min from it == total on and never undershoots.
        gamma = max(0.0, (total_num_steps - it) / max(1, total_num_steps - warmup_num_steps))
    return min_lr + (max_lr - min_lr) * gamma


def warmup_cosine_ratio(
    it: int,
    warmup_num_steps: int,
    total_num_steps: int,
    warmup_min_ratio: float = 0.0,
    cos_min_ratio: float = 1e-4,
    warmup_type: str = "log",
) -> float:
    """Multiplier on the group's original lr; 0 before the first step, whatever the min ratio
    (with a warmup)."""
    if it < 0 and warmup_num_steps > 0:
        return 0.0
    if warmup_num_steps and it < warmup_num_steps:
        base = ds_warmup_gamma(it, warmup_num_steps, warmup_type)
        return warmup_min_ratio + base * (1.0 - warmup_min_ratio)
    p = min(1.0, (it - warmup_num_steps + 1) / max(1, total_num_steps - warmup_num_steps))
    return max(0.0, cos_min_ratio + (1.0 - cos_min_ratio) * (1.0 + math.cos(math.pi * p)) / 2.0)


def lr_range_test_lr(it: int, min_lr: float, step_size: int, step_rate: float, staircase: bool = False) -> float:
    interval = (it + 1) / step_size
    if staircase:
        interval = float(math.floor(interval))
    return min_lr * (1.0 + step_rate * interval)


def one_cycle_scale(
    it: int, first_step_size: float, second_step_size: float, first_stair_count: int = 0, second_stair_count: int = 0
) -> float:
    """Position in the triangle, 0 at the ends, 1 at the peak (it == first - 1)."""
    total = first_step_size + second_step_size
    ratio = first_step_size / total
    b = it + 1
    cycle = math.floor(1 + b / total)
    x = 1 + b / total - cycle
    if x <= ratio:
        scale, count = x / ratio, first_stair_count
    else:
        scale, count = (x - 1) / (ratio - 1), second_stair_count
    if not count:
        return scale
    # Stairs come from integer offsets so that an edge cannot be lost to float rounding
    # (at the peak x can land a hair above ratio; the position is still exactly `count`).
    ci = b % total
    if ci <= first_step_size:
        position = ci * count / first_step_size
    else:
        position = (total - ci) * count / second_step_size
    return math.floor(position) / count


def one_cycle_lr(
    it: int,
    min_lr: float,
    max_lr: float,
    first_step_size: float,
    second_step_size: float,
    first_stair_count: int = 0,
    second_stair_count: int = 0,
    decay_lr_rate: float = 0.0,
    decay_step_size: float = 0,
) -> float:
    total = first_step_size + second_step_size
    if it < total:
        scale = one_cycle_scale(it, first_step_size, second_step_size, first_stair_count, second_stair_count)
        return min_lr + (max_lr - min_lr) * scale
    if decay_step_size == 0 or decay_lr_rate == 0:
        return min_lr
    k = it - total + 1
    return min_lr / (1 + decay_lr_rate * k / decay_step_size)


def one_cycle_mom(
    it: int,
    min_mom: float,
    max_mom: float,
    first_step_size: float,
    second_step_size: float,
    first_stair_count: int = 0,
    second_stair_count: int = 0,
    decay_mom_rate: float = 0.0,
    decay_step_size: float = 0,
) -> float:
    """beta1 mirrors the lr; in the decay phase it grows without a clamp and may exceed 1."""
    total = first_step_size + second_step_size
    if it < total:
        scale = one_cycle_scale(it, first_step_size, second_step_size, first_stair_count, second_stair_count)
        return max_mom - (max_mom - min_mom) * scale
    if decay_step_size == 0 or decay_mom_rate == 0:
        return max_mom
    k = it - total + 1
    return max_mom * (1 + decay_mom_rate * k / decay_step_size)
