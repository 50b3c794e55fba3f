"""Activation checkpointing with DeepSpeed's calls: forward through a block keeps only its
inputs, and backward runs the block again to get what it needs.

    checkpointing.configure(None, deepspeed_config="ds.json")   # or configured by initialize
    hidden = checkpointing.checkpoint(block, hidden, mask)

torch.utils.checkpoint (non-reentrant) does the work, so inputs that need no gradient, keyword
state in the block and nested checkpoints behave as in torch. Of the config's
`activation_checkpointing` block three settings act: `cpu_checkpointing` (configure's
`checkpoint_in_cpu`) keeps each checkpointed block's tensor inputs in pinned host memory
between forward and backward (ALST's activation-checkpoint offload: the device then holds no
block input of the whole sequence until its backward); inputs already in host memory (a
CPU-only run) stay where they are, so there it changes nothing. `synchronize_checkpoint_boundary`
synchronizes the accelerator around each checkpointed forward, and `profile` logs each
one's time. `partition_activations`, `contiguous_memory_optimization` and
`number_checkpoints` are accepted with no effect: there are no model-parallel ranks to split
the saved inputs over, and torch.utils.checkpoint keeps no buffers of its own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.utils.checkpoint

from .accelerator import get_accelerator
from .logs import logger


@dataclass
class _Settings:
    partition_activations: bool = False
    contiguous_memory_optimization: bool = False
    number_checkpoints: int | None = None
    cpu_checkpointing: bool = False
    synchronize_checkpoint_boundary: bool = False
    profile: bool = False


_settings: _Settings | None = None
_layers: int | None = None


def _block(deepspeed_config) -> dict:
    """The activation_checkpointing block of a config given as a path, a dict or a loaded one."""
    if deepspeed_config is None:
        return {}
    block = getattr(deepspeed_config, "activation_checkpointing", None)
    if block is None and not hasattr(deepspeed_config, "activation_checkpointing"):
        from ..config import load_config

        block = load_config(deepspeed_config).activation_checkpointing
    if block is None:
        return {}
    return block.model_dump() if hasattr(block, "model_dump") else dict(block)


def configure(mpu_=None, deepspeed_config=None, partition_activations: bool | None = None,
              contiguous_checkpointing: bool | None = None, num_checkpoints: int | None = None,
              checkpoint_in_cpu: bool | None = None, synchronize: bool | None = None,
              profile: bool | None = None) -> None:
    """Read the settings from `deepspeed_config`'s activation_checkpointing block, then let the
    arguments given (not None) override them. `mpu_` has no effect (no model-parallel split)."""
    global _settings
    settings = _Settings(**{k: v for k, v in _block(deepspeed_config).items() if k in _Settings.__dataclass_fields__})
    for name, value in (("partition_activations", partition_activations),
                        ("contiguous_memory_optimization", contiguous_checkpointing),
                        ("number_checkpoints", num_checkpoints), ("cpu_checkpointing", checkpoint_in_cpu),
                        ("synchronize_checkpoint_boundary", synchronize), ("profile", profile)):
        if value is not None:
            setattr(settings, name, value)
    _settings = settings


def is_configured() -> bool:
    return _settings is not None


def reset() -> None:
    """Between steps DeepSpeed frees its contiguous buffers; there are none to free here."""


def set_num_layers(nlayers: int) -> None:
    global _layers
    _layers = nlayers


def checkpoint(function, *args):
    """`function(*args)`, its activations recomputed in backward instead of kept."""
    settings = _settings or _Settings()
    sync = settings.synchronize_checkpoint_boundary
    if sync:
        get_accelerator().synchronize()
    start = time.perf_counter() if settings.profile else 0.0
    if settings.cpu_checkpointing:
        function, args = _offloaded(function, args)
    out = torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)
    if sync or settings.profile:
        get_accelerator().synchronize()
    if settings.profile:
        logger.info(f"checkpointed forward of {getattr(function, '__name__', type(function).__name__)}: "
                    f"{(time.perf_counter() - start) * 1e3:.2f} ms")
    return out


non_reentrant_checkpoint = checkpoint

_COPY_ON_HOST = False  # tests: copy host tensors too, so the offload's autograd path runs on CPU


class _ToHost(torch.autograd.Function):
    """A copy in (pinned, when an accelerator is there) host memory; the gradient goes back."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.device = x.device
        host = torch.empty(x.shape, dtype=x.dtype, pin_memory=x.device.type != "cpu")
        return host.copy_(x, non_blocking=True)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.to(ctx.device, non_blocking=True)


def _offloaded(function, args: tuple):
    """(a function that brings its tensor inputs back to their device, the inputs in host
    memory): what the checkpoint keeps for backward is then the host copy, and the device
    copy is freed once nothing else holds it."""
    devices = [a.device if torch.is_tensor(a) else None for a in args]
    moved = tuple(_ToHost.apply(a) if d is not None and (d.type != "cpu" or _COPY_ON_HOST) else a
                  for a, d in zip(args, devices))

    def on_device(*inputs):
        return function(*(x.to(d, non_blocking=True) if d is not None else x for x, d in zip(inputs, devices)))

    return on_device, moved
