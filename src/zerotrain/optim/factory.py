"""Optimizer construction from a DeepSpeed-style ``optimizer`` block, or from the user's own.

The engine hands us flat fp32 buffers as parameters, so there are few, large tensors: the
fused (or failing that, foreach) torch kernels update them without a Python loop per tensor.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any

import torch

from ..errors import ConfigError, did_you_mean

from .uncorrected_adam import UncorrectedAdam

_ADAM_DEFAULTS = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0,
                  "amsgrad": False, "bias_correction": True, "adam_w_mode": True,
                  "torch_adam": False}
_SGD_DEFAULTS = {"lr": 1e-3, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0,
                 "nesterov": False}
# Our own names: the config keys each accepts, with defaults. "fused" is accepted by all.
_BUILTIN = {
    "sgd": _SGD_DEFAULTS,
    "momentum": {**_SGD_DEFAULTS, "momentum": 0.9},
    "adam": _ADAM_DEFAULTS,
    "adamw": {**_ADAM_DEFAULTS, "weight_decay": 0.01},
}
# Keys that only select behaviour here and are not passed to torch.
_ROUTING_KEYS = ("bias_correction", "adam_w_mode", "torch_adam", "fused")
_UNSUPPORTED = {
    "LBFGS": "it needs a loss closure at every step, which the engine does not provide",
    "SparseAdam": "it needs sparse gradients and the engine's gradients are dense",
}
_NONNEGATIVE = ("lr", "eps", "weight_decay", "momentum", "dampening")
_BOOLEAN = ("amsgrad", "nesterov", "bias_correction", "adam_w_mode", "torch_adam", "fused")


def _torch_optimizers() -> dict[str, type]:
    found = {}
    for name in dir(torch.optim):
        obj = getattr(torch.optim, name)
        if isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer) \
                and obj is not torch.optim.Optimizer:
            found[name] = obj
    return found


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_value(key: str, value: Any) -> None:
    where = f"optimizer.params.{key}"
    if key in _NONNEGATIVE and not (_is_number(value) and value >= 0):
        raise ConfigError(f"{where} must be a finite number >= 0, got {value!r}")
    if key in _BOOLEAN and not isinstance(value, bool):
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    if key == "betas":
        ok = isinstance(value, (list, tuple)) and len(value) == 2 \
            and all(_is_number(b) and 0 <= b < 1 for b in value)
        if not ok:
            raise ConfigError(f"{where} must be a pair of numbers in [0, 1), got {value!r}")


def _without_no_effect_keys(params: dict) -> dict:
    # max_grad_norm (Megatron's configs carry it) reaches here only beside gradient_clipping,
    # which clips: the config loader refuses it otherwise, and the optimizer never sees it
    return {k: v for k, v in params.items() if k != "max_grad_norm"}


@functools.lru_cache(maxsize=None)
def _fused_works(cls: type, device: torch.device, dtype: torch.dtype) -> bool:
    """Probe one tiny step: torch's own capability lists differ across versions and devices."""
    try:
        probe = torch.zeros(2, device=device, dtype=dtype, requires_grad=True)
        probe.grad = torch.zeros_like(probe)
        cls([probe], fused=True).step()
        return True
    except (RuntimeError, TypeError, ValueError, NotImplementedError):
        return False


def _kernel_kwargs(cls: type, param_groups: list[dict], fused: bool | None) -> dict:
    accepted = inspect.signature(cls.__init__).parameters
    tensors = [p for g in param_groups for p in g.get("params", []) if isinstance(p, torch.Tensor)]
    kinds = {(t.device, t.dtype) for t in tensors}
    can_fuse = "fused" in accepted and bool(kinds) and all(_fused_works(cls, *k) for k in kinds)
    if fused is True:
        if not can_fuse:
            detail = ", ".join(sorted(f"{d.type}/{str(t).removeprefix('torch.')}" for d, t in kinds))
            raise ConfigError(f"optimizer.params.fused: torch has no fused {cls.__name__} kernel "
                              f"for these parameters ({detail or 'none'}); remove the key")
        return {"fused": True}
    if fused is None and can_fuse:
        return {"fused": True}
    return {"foreach": True} if "foreach" in accepted else {}


def _construct(cls: type, param_groups: list[dict], kwargs: dict) -> torch.optim.Optimizer:
    try:
        return cls(param_groups, **kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"optimizer: torch.optim.{cls.__name__} refused the settings: {err}") \
            from err


def _build_builtin(name: str, params: dict, param_groups: list[dict]) -> torch.optim.Optimizer:
    allowed = _BUILTIN[name]
    for key, value in params.items():
        if key not in allowed and key != "fused":
            raise ConfigError(f"optimizer.params.{key}: unknown key"
                              f"{did_you_mean(key, [*allowed, 'fused'])}")
        _check_value(key, value)
    settings = {**allowed, **params}
    fused = settings.pop("fused", None)
    if name in ("sgd", "momentum"):
        cls = torch.optim.SGD
        if settings["nesterov"] and (settings["momentum"] <= 0 or settings["dampening"] != 0):
            raise ConfigError("optimizer.params.nesterov needs momentum > 0 and dampening 0")
    else:
        if name == "adamw" and not settings["adam_w_mode"]:
            raise ConfigError("optimizer.params.adam_w_mode: false is not possible with type "
                              "AdamW; use type Adam with adam_w_mode false for L2 weight decay")
        settings["betas"] = tuple(float(b) for b in settings["betas"])
        if not settings["bias_correction"]:
            if fused:
                raise ConfigError("optimizer.params.fused: torch has no fused kernel for bias_correction "
                                  "false (it runs on foreach kernels); remove the key")
            decoupled = settings["adam_w_mode"]
            for key in _ROUTING_KEYS:
                settings.pop(key, None)
            return _construct(UncorrectedAdam, param_groups, {**settings, "decoupled": decoupled})
        # DeepSpeed's Adam decouples weight decay unless adam_w_mode is false.
        cls = torch.optim.AdamW if settings["adam_w_mode"] else torch.optim.Adam
    for key in _ROUTING_KEYS:
        settings.pop(key, None)
    return _construct(cls, param_groups, {**settings, **_kernel_kwargs(cls, param_groups, fused)})


def _build_torch(cls: type, params: dict, param_groups: list[dict]) -> torch.optim.Optimizer:
    if cls.__name__ in _UNSUPPORTED:
        raise ConfigError(f"optimizer.type: {cls.__name__} cannot be used: "
                          f"{_UNSUPPORTED[cls.__name__]}")
    accepted = [k for k, p in inspect.signature(cls.__init__).parameters.items()
                if k not in ("self", "params") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    for key in params:
        if key not in accepted:
            raise ConfigError(f"optimizer.params.{key}: unknown key for {cls.__name__}"
                              f"{did_you_mean(key, accepted)}")
    settings = dict(params)
    fused = settings.pop("fused", None)
    if fused is not None and not isinstance(fused, bool):
        raise ConfigError(f"optimizer.params.fused must be true or false, got {fused!r}")
    if "foreach" not in settings:
        settings.update(_kernel_kwargs(cls, param_groups, fused))
    elif fused:
        settings["fused"] = True
    return _construct(cls, param_groups, settings)


def build_optimizer(type_name: str, params: dict | None,
                    param_groups: list[dict]) -> torch.optim.Optimizer:
    """Build the optimizer named by the config; ``params`` are defaults a group's own keys override."""
    params = {} if params is None else params
    if not isinstance(params, dict):
        raise ConfigError(f"optimizer.params must be a mapping, got {type(params).__name__}")
    if not isinstance(type_name, str) or not type_name:
        raise ConfigError(f"optimizer.type must be a non-empty string, got {type_name!r}")
    params = _without_no_effect_keys(params)
    if type_name.lower() in _BUILTIN:
        return _build_builtin(type_name.lower(), params, param_groups)
    available = _torch_optimizers()
    if type_name in available:
        return _build_torch(available[type_name], params, param_groups)
    by_lower = {n.lower(): n for n in available}
    hint = (f", did you mean {by_lower[type_name.lower()]}?" if type_name.lower() in by_lower
            else did_you_mean(type_name, [*_BUILTIN, *available]))
    raise ConfigError(f"optimizer.type: unknown optimizer '{type_name}'{hint}")


def _check_groups(param_groups: list[dict]) -> None:
    seen: set[int] = set()
    for i, group in enumerate(param_groups):
        for p in group.get("params", []):
            if not isinstance(p, torch.Tensor) or not p.is_leaf:
                raise ConfigError(f"param group {i}: parameters must be leaf tensors")
            if id(p) in seen:
                raise ConfigError(f"param group {i}: a tensor appears in more than one place")
            seen.add(id(p))


def adapt_client_optimizer(optimizer_or_factory: torch.optim.Optimizer | Callable,
                           param_groups: list[dict]) -> torch.optim.Optimizer:
    """Point the user's optimizer at the engine's parameters, keeping its per-group settings.

    An instance is rebound in place (its groups get our tensors, its state is cleared) rather
    than rebuilt: the object stays the same, so an LR scheduler the user built over it keeps
    working, and third-party optimizers whose constructor takes arguments absent from
    ``defaults`` still work. The user's instance no longer holds the model's own parameters.
    """
    if isinstance(optimizer_or_factory, torch.optim.Optimizer):
        client = optimizer_or_factory
        _check_groups(param_groups)
        if len(client.param_groups) != len(param_groups):
            raise ConfigError(
                f"the client optimizer has {len(client.param_groups)} param groups but the "
                f"engine built {len(param_groups)}; give the engine the same grouping, or pass "
                "a callable that builds the optimizer from the engine's param groups")
        for ours, theirs in zip(param_groups, client.param_groups):
            for key, value in ours.items():
                theirs.setdefault(key, value)
            theirs["params"] = list(ours["params"])
        client.state.clear()
        return client
    if callable(optimizer_or_factory):
        built = optimizer_or_factory(param_groups)
        if not isinstance(built, torch.optim.Optimizer):
            raise ConfigError("the optimizer callable must return a torch.optim.Optimizer, "
                              f"got {type(built).__name__}")
        wanted = {id(p) for g in param_groups for p in g["params"]}
        held = {id(p) for g in built.param_groups for p in g["params"]}
        if held != wanted:
            raise ConfigError("the optimizer callable must build its optimizer over the "
                              "param_groups it is given, not over the model's parameters")
        return built
    raise ConfigError("optimizer must be a torch.optim.Optimizer or a callable taking "
                      f"param_groups, got {type(optimizer_or_factory).__name__}")
