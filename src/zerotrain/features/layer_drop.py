"""Progressive layer drop: the keep-probability schedule theta(t) and its engine wiring.

    theta(t) = (1 - theta) * exp(-gamma * t) + theta      starts at 1, decays to theta

The engine updates theta at each optimizer-step boundary with global_steps before the
increment (also on overflow-skipped steps), so after the k-th step get_pld_theta() is
theta(k), and passes `progressive_layer_drop=True, pld_theta=<theta>` to every training
forward (DeepSpeed 0.19.7, spec section 2). Which blocks a model then drops is
zerotrain.layerdrop's business; this module only says how many, on average.
"""

from __future__ import annotations

import inspect
import logging
import os

import numpy as np

from .. import layerdrop
from ..engine.hooks import EngineFeature
from ..errors import ModelInterfaceError
from .batch import is_hf_model

log = logging.getLogger("zerotrain")


def pld_theta(step: int, theta: float, gamma: float) -> float:
    """theta(t), with numpy's float64 exp as DeepSpeed computes it (bit-identical values)."""
    return float((1.0 - theta) * np.exp(-gamma * step) + theta)


class ProgressiveLayerDrop:
    """DeepSpeed's PLD state: `current_theta` starts at 1.0 (nothing dropped)."""

    def __init__(self, theta: float = 0.5, gamma: float = 0.001):
        self.theta = theta
        self.gamma = gamma
        self.current_theta = 1.0
        if os.environ.get("RANK", "0") == "0":
            log.info("Enabled progressive layer dropping (theta = %s)", self.theta)

    def get_state(self) -> dict:
        return {"progressive_layer_drop": True, "pld_theta": self.get_theta()}

    def get_theta(self) -> float:
        return self.current_theta

    def update_state(self, global_step: int) -> None:
        self.current_theta = pld_theta(global_step, self.theta, self.gamma)


def _signature(module):
    try:
        return inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return None


class LayerDropFeature(EngineFeature):
    """Checks the model at initialize, feeds theta to the forward and the step to the blocks."""

    name = "progressive_layer_drop"

    def __init__(self, theta: float, gamma: float):
        self.pld = ProgressiveLayerDrop(theta, gamma)
        self.blocks: list[layerdrop.LayerDrop] = []

    def on_train_start(self, engine) -> None:
        module = engine.module
        if not layerdrop.takes_pld_kwargs(module):
            params = _signature(module)
            var_kw = params is None or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
            if is_hf_model(module):
                # HF forwards take **kwargs but ignore unknown keys: PLD would silently do nothing
                blocks = layerdrop.wrap(module)
                if engine.comm.rank == 0:
                    log.info("progressive layer drop: %d blocks of %s made switchable", len(blocks),
                             type(module).__name__)
            elif not var_kw:
                raise ModelInterfaceError(
                    f"progressive_layer_drop is enabled but {type(module).__name__}.forward cannot take the "
                    f"keyword arguments {' and '.join(layerdrop.PLD_KWARGS)} that the engine passes in training; "
                    "add them (zerotrain.models has switchable blocks), wrap an HF model with "
                    "zerotrain.layerdrop.wrap(model), or disable progressive_layer_drop")
        self.blocks = layerdrop.find(module)

    def before_forward(self, engine, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        # The mask key is the optimizer step: shared by every rank and micro-batch of the step,
        # and restored with global_steps on resume.
        for b in self.blocks:
            b.pass_key = engine.global_steps
        return args, {**kwargs, **self.pld.get_state()}

    def on_boundary(self, engine) -> None:
        self.pld.update_state(engine.global_steps)

    def value(self, key: str):
        return self.pld.get_theta() if key == "pld_theta" else None

    def log_fields(self, engine) -> dict:
        return {"pld_theta": f"{self.pld.get_theta():.4f}"}

    def state_dict(self) -> dict:
        return {"current_theta": self.pld.current_theta}

    def load_state_dict(self, state: dict) -> None:
        self.pld.current_theta = state["current_theta"]
