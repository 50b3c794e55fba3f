"""HF-Trainer style `get_scheduler` and the warmup-steps rule.

The curves are in `functional.py`; this file only checks arguments the way HF does (so a
user's `lr_scheduler_type` / `lr_scheduler_kwargs` carry over) and wraps the curve in a
torch `LambdaLR`. Unknown kwargs are errors here, where HF would raise a bare TypeError or
silently drop them.
"""

from __future__ import annotations

import inspect
import math
import warnings
from functools import partial
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, ReduceLROnPlateau

from ..errors import ConfigError, did_you_mean
from . import functional as F

SCHEDULER_TYPES = [
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "reduce_lr_on_plateau",
    "cosine_with_min_lr",
    "cosine_warmup_with_min_lr",
    "warmup_stable_decay",
    "warmup_linear_decay_exp",
]

# Extra kwargs each type accepts, with their defaults. `last_epoch` goes to LambdaLR.
_EXTRA: dict[str, dict[str, Any]] = {
    "linear": {},
    "cosine": {"num_cycles": 0.5},
    "cosine_with_restarts": {"num_cycles": 1},
    "polynomial": {"lr_end": 1e-7, "power": 1.0},
    "constant": {},
    "constant_with_warmup": {},
    "inverse_sqrt": {"timescale": None},
    "cosine_with_min_lr": {"num_cycles": 0.5, "min_lr": None, "min_lr_rate": None},
    "cosine_warmup_with_min_lr": {"num_cycles": 0.5, "min_lr": None, "min_lr_rate": None, "warmup_lr_rate": None},
    "warmup_stable_decay": {
        "num_decay_steps": None,
        "num_stable_steps": None,
        "warmup_type": "linear",
        "decay_type": "cosine",
        "min_lr_ratio": 0.0,
        "num_cycles": 0.5,
    },
    # the BERT PLD recipe's schedule (spec 9.2): warmup fraction = num_warmup_steps / num_training_steps
    "warmup_linear_decay_exp": {"decay_rate": 0.99, "decay_steps": 1000},
}
# Read from torch so a torch upgrade that adds or drops an option needs no change here.
_PLATEAU_KEYS = tuple(p for p in inspect.signature(ReduceLROnPlateau).parameters if p != "optimizer")
_ALIASES = {"reduce_on_plateau": "reduce_lr_on_plateau"}
# Types that need neither N (HF requirement table, spec 3.2).
_NO_TOTAL = ("constant_with_warmup", "inverse_sqrt", "warmup_stable_decay")


def _normalise_name(name: Any) -> str:
    """Accept 'cosine', 'COSINE', 'SchedulerType.COSINE' or an enum whose value is the name."""
    raw = getattr(name, "value", name)
    if not isinstance(raw, str):
        raise ConfigError(f"lr_scheduler_type: expected a string, got {type(name).__name__}")
    key = raw.strip().lower().replace("-", "_")
    if key.startswith("schedulertype."):
        key = key[len("schedulertype.") :]
    key = _ALIASES.get(key, key)
    if key == "greedy":
        raise ConfigError("lr_scheduler_type: 'greedy' is not supported by zerotrain")
    if key not in SCHEDULER_TYPES:
        raise ConfigError(f"lr_scheduler_type: unknown scheduler {raw!r}{did_you_mean(key, SCHEDULER_TYPES)}")
    return key


def _merge_kwargs(name: str, specific: dict | None, extra: dict) -> dict:
    merged = dict(specific or {})
    for key, value in extra.items():
        if key in merged and merged[key] != value:
            raise ConfigError(f"lr_scheduler_kwargs.{key}: given twice with different values")
        merged[key] = value
    allowed = list(_PLATEAU_KEYS) if name == "reduce_lr_on_plateau" else [*_EXTRA[name], "last_epoch"]
    for key in merged:
        if key not in allowed:
            hint = did_you_mean(key, allowed) or (f", {name} accepts {', '.join(allowed)}" if allowed else "")
            raise ConfigError(f"lr_scheduler_kwargs.{key}: unknown key for {name}{hint}")
    return merged


def _min_lr_rate(optimizer: Optimizer, min_lr: float | None, min_lr_rate: float | None) -> float:
    if (min_lr is None) == (min_lr_rate is None):
        raise ValueError("exactly one of min_lr and min_lr_rate must be set")
    if min_lr_rate is not None:
        return float(min_lr_rate)
    return float(min_lr) / float(optimizer.defaults["lr"])


def get_scheduler(
    name: Any,
    optimizer: Optimizer,
    num_warmup_steps: int | None = None,
    num_training_steps: int | None = None,
    scheduler_specific_kwargs: dict | None = None,
    **kwargs: Any,
) -> LambdaLR | ReduceLROnPlateau:
    """Build an HF-Trainer schedule; LambdaLR for all types but plateau."""
    name = _normalise_name(name)
    kw = _merge_kwargs(name, scheduler_specific_kwargs, kwargs)
    if name == "reduce_lr_on_plateau":
        return ReduceLROnPlateau(optimizer, **kw)
    last_epoch = kw.pop("last_epoch", -1)
    opts = {**_EXTRA[name], **kw}
    W, N = num_warmup_steps, num_training_steps
    if name == "constant":
        return LambdaLR(optimizer, F.constant_multiplier, last_epoch=last_epoch)

    if W is None:
        raise ValueError(f"{name} requires `num_warmup_steps`, please provide that argument.")
    if W < 0:
        raise ValueError(f"num_warmup_steps must be >= 0, got {W}")
    if name not in _NO_TOTAL and N is None:
        raise ValueError(f"{name} requires `num_training_steps`, please provide that argument.")

    if name == "linear":
        fn = partial(F.linear_multiplier, num_warmup_steps=W, num_training_steps=N)
    elif name == "cosine":
        fn = partial(F.cosine_multiplier, num_warmup_steps=W, num_training_steps=N, num_cycles=opts["num_cycles"])
    elif name == "cosine_with_restarts":
        fn = partial(
            F.cosine_with_restarts_multiplier, num_warmup_steps=W, num_training_steps=N, num_cycles=opts["num_cycles"]
        )
    elif name == "polynomial":
        # HF reads the constructor lr, not each group's, so multi-group runs scale alike.
        lr_init = float(optimizer.defaults["lr"])
        if not lr_init > opts["lr_end"]:
            raise ValueError(f"lr_end ({opts['lr_end']}) must be smaller than the initial lr ({lr_init})")
        fn = partial(
            F.polynomial_multiplier,
            num_warmup_steps=W,
            num_training_steps=N,
            lr_init=lr_init,
            lr_end=opts["lr_end"],
            power=opts["power"],
        )
    elif name == "constant_with_warmup":
        fn = partial(F.constant_with_warmup_multiplier, num_warmup_steps=W)
    elif name == "inverse_sqrt":
        timescale = opts["timescale"] if opts["timescale"] is not None else F.default_timescale(W)
        fn = partial(F.inverse_sqrt_multiplier, num_warmup_steps=W, timescale=timescale)
    elif name in ("cosine_with_min_lr", "cosine_warmup_with_min_lr"):
        rate = _min_lr_rate(optimizer, opts["min_lr"], opts["min_lr_rate"])
        if name == "cosine_with_min_lr":
            fn = partial(F.cosine_with_min_lr_multiplier, num_warmup_steps=W, num_training_steps=N, min_lr_rate=rate,
                         num_cycles=opts["num_cycles"])
        else:
            fn = partial(F.cosine_warmup_with_min_lr_multiplier, num_warmup_steps=W, num_training_steps=N,
                         min_lr_rate=rate, num_cycles=opts["num_cycles"], warmup_lr_rate=opts["warmup_lr_rate"])
    elif name == "warmup_linear_decay_exp":
        fn = _linear_decay_exp(W, N, opts)
    else:
        fn = _wsd(W, N, opts)
    return LambdaLR(optimizer, fn, last_epoch=last_epoch)


def _linear_decay_exp(W: int, N: int, opts: dict) -> partial:
    if N <= 0:
        raise ValueError(f"warmup_linear_decay_exp needs num_training_steps > 0, got {N}")
    rate, steps = opts["decay_rate"], opts["decay_steps"]
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1:
        raise ValueError(f"decay_rate: should be a number in (0, 1], got {rate!r}")
    if isinstance(steps, bool) or not isinstance(steps, (int, float)) or not steps > 0:
        raise ValueError(f"decay_steps: should be a number > 0, got {steps!r}")
    # W == 0 leaves the multiplier at 1 for good, decay included (the recipe's quirk, kept)
    return partial(F.warmup_linear_decay_exp_multiplier, num_training_steps=N, warmup=W / N,
                   decay_rate=float(rate), decay_steps=float(steps))


def _wsd(W: int, N: int | None, opts: dict) -> partial:
    decay = opts["num_decay_steps"]
    if decay is None:
        raise ValueError("warmup_stable_decay requires `num_decay_steps` in the scheduler kwargs")
    stable = opts["num_stable_steps"]
    if stable is None:
        if N is None:
            raise ValueError("warmup_stable_decay requires `num_training_steps` or `num_stable_steps`")
        stable = N - W - decay
        if stable < 0:
            warnings.warn(
                f"warmup_stable_decay: warmup ({W}) + decay ({decay}) exceed the {N} training steps; "
                "decay starts before warmup ends",
                stacklevel=3,
            )
    elif N is not None:
        warnings.warn("warmup_stable_decay: both num_training_steps and num_stable_steps given, "
                      "num_stable_steps wins", stacklevel=3)
    for key in ("warmup_type", "decay_type"):
        if opts[key] not in F.WSD_CURVES:
            raise ValueError(f"{key}: unknown {opts[key]!r}, expected one of {', '.join(F.WSD_CURVES)}")
    return partial(
        F.warmup_stable_decay_multiplier,
        num_warmup_steps=W,
        num_stable_steps=stable,
        num_decay_steps=decay,
        warmup_type=opts["warmup_type"],
        decay_type=opts["decay_type"],
        min_lr_ratio=opts["min_lr_ratio"],
        num_cycles=opts["num_cycles"],
    )


def resolve_warmup_steps(num_training_steps: int, warmup_steps: float = 0, warmup_ratio: float = 0.0) -> int:
    """Warmup length from either HF style (zerotrain choice 7).

    4.x: `warmup_steps > 0` wins, else `ceil(N * warmup_ratio)`. 5.x: a `warmup_steps` in
    (0, 1) is itself a ratio. Values >= 1 are truncated (1.5 -> 1), as HF 5.x does.
    """
    for key, value in (("warmup_steps", warmup_steps), ("warmup_ratio", warmup_ratio)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
    if num_training_steps < 0:
        raise ConfigError(f"num_training_steps: must be >= 0, got {num_training_steps}")
    if warmup_steps < 0:
        raise ConfigError(f"warmup_steps: must be >= 0 (a step count, or a ratio below 1), got {warmup_steps}")
    if not 0.0 <= warmup_ratio <= 1.0:
        raise ConfigError(f"warmup_ratio: must be in [0, 1], got {warmup_ratio}")
    if warmup_steps >= 1:
        return int(warmup_steps)
    if warmup_steps > 0:
        return math.ceil(num_training_steps * warmup_steps)
    return math.ceil(num_training_steps * warmup_ratio)
