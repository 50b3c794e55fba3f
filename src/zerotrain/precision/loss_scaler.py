"""fp16 loss scaling.

One dynamic algorithm for every ZeRO stage: DeepSpeed's hysteresis scaler (reference §4,
algorithm A), so a DeepSpeed fp16 block gives the same scale sequence here. The one
deliberate difference: at the floor we keep skipping instead of raising, and count those
overflows so the engine can warn at a limited rate and stop through its own skip limit.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import CheckpointError, ConfigError

_DYNAMIC_STATE = ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis",
                  "overflows_at_floor")


def _number(value: Any, key: str, *, minimum: float, inclusive: bool) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value >= minimum if inclusive else value > minimum)
    if not ok:
        bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
        raise ConfigError(f"{key} must be a finite number {bound}, got {value!r}")
    return float(value)


def _integer(value: Any, key: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key} must be an integer >= {minimum}, got {value!r}")
    return value


def _check_kind(state: dict, kind: str) -> None:
    saved = state.get("kind") if isinstance(state, dict) else None
    if saved != kind:
        raise CheckpointError(
            f"loss scaler state is {saved!r} but the current fp16 config gives a {kind} scaler; "
            "set fp16.loss_scale as it was when the checkpoint was saved, or skip loading "
            "the scaler state")


class DynamicLossScaler:
    """Hysteresis loss scaler (DeepSpeed algorithm A) that never raises at the floor."""

    dynamic = True

    def __init__(self, init_scale: float = 2.0**16, scale_window: int = 1000,
                 min_scale: float = 1.0, hysteresis: int = 2,
                 consecutive_hysteresis: bool = False) -> None:
        self.init_scale = _number(init_scale, "fp16 initial scale (2**fp16.initial_scale_power)",
                                  minimum=0.0, inclusive=False)
        self.scale_window = _integer(scale_window, "fp16.loss_scale_window", minimum=1)
        self.min_scale = _number(min_scale, "fp16.min_loss_scale", minimum=0.0, inclusive=False)
        self.hysteresis = _integer(hysteresis, "fp16.hysteresis", minimum=1)
        if not isinstance(consecutive_hysteresis, bool):
            raise ConfigError(f"fp16.consecutive_hysteresis must be true or false, "
                              f"got {consecutive_hysteresis!r}")
        self.consecutive_hysteresis = consecutive_hysteresis
        if self.init_scale < self.min_scale:
            raise ConfigError(f"fp16 initial scale {self.init_scale:g} is below "
                              f"fp16.min_loss_scale {self.min_scale:g}; raise "
                              "fp16.initial_scale_power or lower fp16.min_loss_scale")
        self.cur_scale = self.init_scale
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.cur_hysteresis = self.hysteresis
        # Overflows seen while already at min_scale: each one is a skipped step that no
        # amount of shrinking can fix, so the engine reports them (rate-limited).
        self.overflows_at_floor = 0

    @property
    def loss_scale(self) -> float:
        return self.cur_scale

    @property
    def dynamic_loss_scale(self) -> bool:  # DeepSpeed's name
        return True

    @property
    def at_floor(self) -> bool:
        return self.cur_scale <= self.min_scale

    def update_scale(self, overflow: bool) -> None:
        if overflow:
            if self.hysteresis == 1 or self.cur_hysteresis == 1:
                if self.at_floor:
                    self.overflows_at_floor += 1
                else:
                    self.cur_scale = max(self.cur_scale / 2.0, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.hysteresis
            stable = self.cur_iter - self.last_overflow_iter - 1
            if stable > 0 and stable % self.scale_window == 0:
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.hysteresis
                self.cur_scale *= 2.0
        self.cur_iter += 1

    def state_dict(self) -> dict:
        """Plain Python numbers so the checkpoint loads with weights_only=True."""
        state: dict[str, Any] = {"kind": "dynamic"}
        state.update({k: getattr(self, k) for k in _DYNAMIC_STATE})
        state.update(init_scale=self.init_scale, scale_window=self.scale_window,
                     min_scale=self.min_scale, hysteresis=self.hysteresis,
                     consecutive_hysteresis=self.consecutive_hysteresis)
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore progress only; the window, floor and hysteresis come from the current config."""
        _check_kind(state, "dynamic")
        missing = [k for k in _DYNAMIC_STATE if k not in state]
        if missing:
            raise CheckpointError(f"loss scaler state lacks {', '.join(missing)}")
        self.cur_scale = max(float(state["cur_scale"]), self.min_scale)
        self.cur_iter = int(state["cur_iter"])
        self.last_overflow_iter = int(state["last_overflow_iter"])
        self.cur_hysteresis = min(max(int(state["cur_hysteresis"]), 1), self.hysteresis)
        self.overflows_at_floor = int(state["overflows_at_floor"])

    def __repr__(self) -> str:
        return (f"DynamicLossScaler(scale={self.cur_scale:g}, iter={self.cur_iter}, "
                f"hysteresis={self.cur_hysteresis}/{self.hysteresis})")


class StaticLossScaler:
    """Fixed scale from fp16.loss_scale > 0; overflowing steps are still skipped by the engine."""

    dynamic = False
    dynamic_loss_scale = False  # DeepSpeed's name
    scale_window = None  # a static scale never grows

    def __init__(self, scale: float) -> None:
        self.cur_scale = _number(scale, "fp16.loss_scale", minimum=0.0, inclusive=False)

    @property
    def loss_scale(self) -> float:
        return self.cur_scale

    def update_scale(self, overflow: bool) -> None:
        pass

    def state_dict(self) -> dict:
        return {"kind": "static", "cur_scale": self.cur_scale}

    def load_state_dict(self, state: dict) -> None:
        """The scale is configuration, so the current config's value wins."""
        _check_kind(state, "static")

    def __repr__(self) -> str:
        return f"StaticLossScaler(scale={self.cur_scale:g})"


def build_loss_scaler(fp16_enabled: bool, loss_scale: float, initial_scale_power: int,
                      loss_scale_window: int, hysteresis: int, consecutive_hysteresis: bool,
                      min_loss_scale: float) -> DynamicLossScaler | StaticLossScaler | None:
    """Map the fp16 config block to a scaler; None means no scaling (fp32 or bf16)."""
    if not fp16_enabled:
        return None
    scale = _number(loss_scale, "fp16.loss_scale", minimum=0.0, inclusive=True)
    if scale > 0:
        return StaticLossScaler(scale)
    power = _integer(initial_scale_power, "fp16.initial_scale_power", minimum=0)
    return DynamicLossScaler(init_scale=2.0**power, scale_window=loss_scale_window,
                             min_scale=min_loss_scale, hysteresis=hysteresis,
                             consecutive_hysteresis=consecutive_hysteresis)
