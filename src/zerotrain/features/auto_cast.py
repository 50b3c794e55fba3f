"""fp16 `auto_cast`: the model computes in fp16, so floating-point inputs arrive as fp16.

DeepSpeed's `"fp16": {"auto_cast": true}` casts every floating-point tensor of a forward's
inputs to half; a model fed fp32 features (an MLP on embeddings, a vision stem) then runs on
the fp16 weights without casting in its own forward. Integer tensors (token ids, labels,
masks) are left as they are. Training forwards only, as every feature hook.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..engine.hooks import EngineFeature


def cast_floats(value, dtype: torch.dtype = torch.float16):
    """`value` with every floating-point tensor inside tuples, lists and dicts cast to dtype."""
    if torch.is_tensor(value):
        return value.to(dtype) if value.is_floating_point() and value.dtype != dtype else value
    if isinstance(value, Mapping):
        return {k: cast_floats(v, dtype) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(cast_floats(v, dtype) for v in value)
    return value


class AutoCastFeature(EngineFeature):
    name = "fp16_auto_cast"

    def before_forward(self, engine, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return cast_floats(args), cast_floats(kwargs)
