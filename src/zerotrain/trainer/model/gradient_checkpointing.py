"""--gradient_checkpointing: recompute each transformer block in backward instead of keeping
its activations. zerotrain's models and the HF models whose block list layer drop knows are
switched block by block; other HF models use their own switch."""

from __future__ import annotations

import torch
from torch import nn

from ...errors import ConfigError

_CHECKPOINTED: dict[type, type] = {}


def _checkpointed_class(cls: type) -> type:
    """A subclass whose __call__ runs under torch.utils.checkpoint. Changing the block's class
    (not wrapping it) keeps parameter names, and the module hooks (ZeRO-3 gathers) run inside
    the checkpointed call, so the recompute in backward gathers again."""

    def __call__(self, *args, **kwargs):
        if not (self.training and torch.is_grad_enabled()):
            return cls.__call__(self, *args, **kwargs)
        from torch.utils.checkpoint import checkpoint

        return checkpoint(cls.__call__, self, *args, use_reentrant=False, **kwargs)

    if cls not in _CHECKPOINTED:
        _CHECKPOINTED[cls] = type(f"Checkpointed{cls.__name__}", (cls,), {"__call__": __call__})
    return _CHECKPOINTED[cls]


def enable_gradient_checkpointing(model: nn.Module) -> int:
    """Recompute every transformer block in backward; returns the number of blocks."""
    from ...features.layer_drop import find

    lists = find(model)
    if not lists:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers 5.x name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            return sum(1 for m in model.modules() if getattr(m, "gradient_checkpointing", False))
        if hasattr(model, "gradient_checkpointing_enable"):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            return sum(1 for m in model.modules() if getattr(m, "gradient_checkpointing", False))
        raise ConfigError(f"gradient_checkpointing: {type(model).__name__} has no block list zerotrain knows; "
                          "use a zerotrain or HF model")
    count = 0
    for blocks in lists:
        for block in blocks._modules.values():
            block.__class__ = _checkpointed_class(type(block))
            count += 1
    return count
