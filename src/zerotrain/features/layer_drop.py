"""Progressive layer drop (PLD), in one place: the schedule theta(t), the engine feature that
feeds it to the model, and the switchable block lists that act on it.

    theta(t) = (1 - theta) * exp(-gamma * t) + theta      starts at 1, decays to theta

The engine updates theta at each optimizer-step boundary with global_steps before the
increment (also on overflow-skipped steps), so after the k-th step get_pld_theta() is
theta(k), and passes `progressive_layer_drop=True, pld_theta=<theta>` to every training
forward (DeepSpeed 0.19.7, spec section 2). Which blocks a model then drops:

    block i (1-based) of L is kept with   p_i = 1 - (i / L) * (1 - theta)
    one forward pass:   u = L uniforms from a generator seeded by (seed, key); keep_i = u_i < p_i
    kept block:         x + (block(x) - x) / p_i    inverted stochastic depth: the expected
                                                     output equals eval mode, where all run
    dropped block:      x                           never called: no forward, no backward,
                                                     and no ZeRO-3 gather of its parameters

`key` is the optimizer step (the engine sets it), so every rank and every micro-batch of a
step drops the same blocks: the mask must agree across ranks (ZeRO-3 gathers in lock step),
splitting the global batch differently gives the same training, and a resumed run draws the
same masks. No global RNG is touched, so dropout streams are unaffected.

`LayerDrop` is an nn.ModuleList (same state-dict keys) whose iteration yields, during a
planned pass, the kept blocks (scaled) and stand-ins for the dropped ones. Our models plan
a pass from their `progressive_layer_drop` / `pld_theta` arguments; `wrap(model)` turns the
block list of an HF model into one and takes those two arguments off its forward call.
"""

from __future__ import annotations

import contextlib
import logging
import os

import numpy as np
import torch
from torch import nn

from ..engine.hooks import EngineFeature
from ..errors import ModelInterfaceError
from .model_api import forward_accepts, is_hf_model

log = logging.getLogger("zerotrain")

PLD_KWARGS = ("progressive_layer_drop", "pld_theta")
# Where common HF models keep their blocks: GPT-2, LLaMA / Qwen / Mistral, BERT / RoBERTa.
HF_BLOCK_PATHS = ("transformer.h", "h", "model.layers", "layers", "bert.encoder.layer",
                  "roberta.encoder.layer", "encoder.layer")
_M64 = (1 << 64) - 1


def keep_probabilities(num_layers: int, theta: float) -> list[float]:
    return [1.0 - (i / num_layers) * (1.0 - theta) for i in range(1, num_layers + 1)]


def _mix(seed: int, key: int) -> int:
    """splitmix64 of (seed, key): nearby steps get unrelated generator seeds."""
    z = ((seed & _M64) * 0x9E3779B97F4A7C15 + (key & _M64) + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def keep_mask(num_layers: int, theta: float, seed: int, key: int) -> list[bool]:
    """Which blocks run in the pass identified by (seed, key); pure and rank-independent."""
    u = torch.rand(num_layers, generator=torch.Generator().manual_seed(_mix(seed, key)), dtype=torch.float64)
    return [bool(x < p) for x, p in zip(u.tolist(), keep_probabilities(num_layers, theta))]


class _Skip:
    """Stands in for a dropped block: returns its input as the block would return its output."""

    def __init__(self, owner: LayerDrop, block: nn.Module):
        self.owner, self.block = owner, block

    def __getattr__(self, name):  # model code may read e.g. `layer.attention_type`
        if name in ("owner", "block", "p"):  # not set yet (copying): no recursion
            raise AttributeError(name)
        return getattr(self.block, name)

    def __call__(self, *args, **kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        arity = self.owner.output_arity
        return x if arity is None else (x,) + (None,) * (arity - 1)


class _Scaled(_Skip):
    """A kept block whose residual branch is divided by its keep probability."""

    def __init__(self, owner: LayerDrop, block: nn.Module, p: float):
        super().__init__(owner, block)
        self.p = p

    def __call__(self, *args, **kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        out = self.block(*args, **kwargs)
        if torch.is_tensor(out):
            self.owner.output_arity = None
            return x + (out - x) / self.p
        self.owner.output_arity = len(out)  # older HF layers return (hidden, extras...)
        return (x + (out[0] - x) / self.p, *out[1:])


class LayerDrop(nn.ModuleList):
    """A block list that can skip blocks for one forward pass at a time."""

    def __init__(self, modules=None, seed: int = 0):
        super().__init__(modules)
        self._init_state(seed)

    def _init_state(self, seed: int) -> None:
        self.seed = seed
        self.pass_key: int | None = None  # set by the engine before each training forward
        self.passes = 0  # fallback key when no engine drives the model
        self.output_arity: int | None = None  # None: blocks return a tensor
        self.mask: list[bool] | None = None
        self.probs: list[float] | None = None

    def plan(self, theta: float | None) -> None:
        """Decide the blocks of the coming pass; theta None runs them all, unscaled."""
        if theta is None:
            self.mask = self.probs = None
            return
        key = self.pass_key if self.pass_key is not None else self.passes
        self.passes += 1
        self.pass_key = None
        self.probs = keep_probabilities(len(self), float(theta))
        self.mask = keep_mask(len(self), float(theta), self.seed, key)

    def clear(self) -> None:
        self.mask = self.probs = None

    @contextlib.contextmanager
    def dropping(self, theta: float | None):
        self.plan(theta)
        try:
            yield self
        finally:
            self.clear()

    def active(self) -> list:
        """What iterating yields: blocks, scaled kept blocks and stand-ins for dropped ones."""
        blocks = list(self._modules.values())
        if self.mask is None:
            return blocks
        return [(b if p == 1.0 else _Scaled(self, b, p)) if keep else _Skip(self, b)
                for b, keep, p in zip(blocks, self.mask, self.probs)]

    def __iter__(self):
        return iter(self.active())

    def __getitem__(self, idx):
        if isinstance(idx, slice):  # `self.layers[: n]` in LLaMA / Qwen must see the plan too
            return self.active()[idx] if self.mask is not None else nn.ModuleList(list(self._modules.values())[idx])
        return super().__getitem__(idx)


# ---- HF models ------------------------------------------------------------------------------
class _TakePLDKwargs:
    """Forward pre-hook: consume the PLD kwargs and plan the pass (a class, so deepcopy and
    pickle of the model carry it along with the right block lists)."""

    def __init__(self, blocks: list[LayerDrop]):
        self.blocks = blocks

    def __call__(self, module, args, kwargs):
        on = kwargs.pop("progressive_layer_drop", False)
        theta = kwargs.pop("pld_theta", None)
        for b in self.blocks:
            b.plan(theta if on and module.training else None)
        return args, kwargs


class _EndPass:
    def __init__(self, blocks: list[LayerDrop]):
        self.blocks = blocks

    def __call__(self, module, args, output):
        for b in self.blocks:
            b.clear()


def takes_pld_kwargs(model: nn.Module) -> bool:
    """True when the model's forward consumes the PLD kwargs itself or through `wrap`."""
    if any(isinstance(h, _TakePLDKwargs) for h in model._forward_pre_hooks.values()):
        return True
    return len(forward_accepts(model).named(PLD_KWARGS)) == len(PLD_KWARGS)


def find(model: nn.Module) -> list[LayerDrop]:
    return [m for m in model.modules() if isinstance(m, LayerDrop)]


def wrap(model: nn.Module, path: str | None = None, seed: int = 0) -> LayerDrop:
    """Make the block list at `path` (found automatically for common HF models) switchable,
    in place: same modules, same parameter names, only the list's class changes."""
    candidates = [path] if path else HF_BLOCK_PATHS
    for where in candidates:
        try:
            blocks = model.get_submodule(where)
        except AttributeError:
            continue
        if type(blocks) is nn.ModuleList:
            blocks.__class__ = LayerDrop
            blocks._init_state(seed)
        if isinstance(blocks, LayerDrop):
            hooks = [h for h in model._forward_pre_hooks.values() if isinstance(h, _TakePLDKwargs)]
            if hooks:
                if all(b is not blocks for b in hooks[0].blocks):
                    hooks[0].blocks.append(blocks)
            elif not takes_pld_kwargs(model):  # our own models plan passes themselves
                lists = [blocks]
                model.register_forward_pre_hook(_TakePLDKwargs(lists), with_kwargs=True)
                model.register_forward_hook(_EndPass(lists), always_call=True)
            return blocks
    raise ModelInterfaceError(
        f"progressive_layer_drop: no block list found in {type(model).__name__} (looked for "
        f"{', '.join(candidates)}); pass path='<dotted name of the nn.ModuleList of blocks>'")


# ---- the schedule and its engine wiring ----------------------------------------------------


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


class LayerDropFeature(EngineFeature):
    """Checks the model at initialize, feeds theta to the forward and the step to the blocks."""

    name = "progressive_layer_drop"

    def __init__(self, theta: float, gamma: float):
        self.pld = ProgressiveLayerDrop(theta, gamma)
        self.blocks: list[LayerDrop] = []

    def on_train_start(self, engine) -> None:
        module = engine.module
        if not takes_pld_kwargs(module):
            accepts = forward_accepts(module)
            var_kw = accepts.any_keyword or not accepts.readable
            if is_hf_model(module):
                # HF forwards take **kwargs but ignore unknown keys: PLD would silently do nothing
                blocks = wrap(module)
                if engine.comm.rank == 0:
                    log.info("progressive layer drop: %d blocks of %s made switchable", len(blocks),
                             type(module).__name__)
            elif not var_kw:
                raise ModelInterfaceError(
                    f"progressive_layer_drop is enabled but {type(module).__name__}.forward cannot take the "
                    f"keyword arguments {' and '.join(PLD_KWARGS)} that the engine passes in training; "
                    "add them (zerotrain.models has switchable blocks), wrap an HF model with "
                    "zerotrain.wrap(model), or disable progressive_layer_drop")
        self.blocks = find(module)

    def before_forward(self, engine, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        # The mask key is the optimizer step: shared by every rank and micro-batch of the step,
        # and restored with global_steps on resume.
        for b in self.blocks:
            b.pass_key = engine.global_steps
        return args, {**kwargs, **self.pld.get_state()}

    def on_boundary(self, engine) -> None:
        self.pld.update_state(engine.global_steps)

    def log_fields(self, engine) -> dict:
        return {"pld_theta": self.pld.get_theta()}

    def state_dict(self) -> dict:
        return {"current_theta": self.pld.current_theta}

    def load_state_dict(self, state: dict) -> None:
        self.pld.current_theta = state["current_theta"]
