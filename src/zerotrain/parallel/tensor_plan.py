"""Which layers a tensor-parallel split cuts, and how: {module path: style}.

    zerotrain GPT / BERT   every PreLNBlock: models/block.py's TP_PLAN
    HF models              the config's `base_model_tp_plan` ("layers.*.self_attn.q_proj":
                           "colwise", ...), under the model's base_model_prefix

The embedding and the head stay whole on every tensor rank (the logits are computed where
the loss is, never gathered). Checked before anything is split: the heads (and key/value
heads) and every split width must divide by the tensor size, and a model with no plan, or
with a style zerotrain does not split, is one line naming what to change.
"""

from __future__ import annotations

import re

from torch import nn

from ..errors import ConfigError
from ..models.block import TP_PLAN, PreLNBlock

_FIX = "set tensor_parallel.autotp_size (zerotrain train --tensor_parallel_size) to a divisor of it"
_STYLES = ("colwise", "rowwise")


def _heads(count: int, what: str, size: int) -> None:
    if count % size:
        raise ConfigError(f"tensor_parallel.autotp_size {size}: the model has {count} {what}, not divisible by "
                          f"{size}; {_FIX}")


def _zerotrain_plan(model: nn.Module, size: int) -> dict[str, str]:
    plan = {}
    for path, block in model.named_modules():
        if isinstance(block, PreLNBlock):
            _heads(block.n_head, "attention heads", size)
            plan.update({f"{path}.{name}": style for name, style in TP_PLAN.items()})
    return plan


def _hf_plan(model: nn.Module, size: int) -> dict[str, str] | None:
    """The plan of the first HF model inside `model` (itself, or one a wrapper holds)."""
    for root, hf in model.named_modules():
        config = getattr(hf, "config", None)
        rules = getattr(config, "base_model_tp_plan", None) if config is not None else None
        if rules:
            return _hf_rules(hf, config, rules, size, root + "." if root else "")
    return None


def _hf_rules(model: nn.Module, config, rules: dict, size: int, root: str) -> dict[str, str]:
    for attr, what in (("num_attention_heads", "attention heads"), ("num_key_value_heads", "key/value heads")):
        count = getattr(config, attr, None)
        if isinstance(count, int):
            _heads(count, what, size)
    prefix = getattr(model, "base_model_prefix", "")
    base = root + (prefix + "." if prefix and hasattr(model, prefix) else "")
    patterns = [(re.compile(re.escape(base + key).replace(r"\*", r"\d+") + "$"), key, style)
                for key, style in rules.items()]
    plan = {}
    for path, _ in model.named_modules(prefix=root.rstrip(".")):
        for pattern, key, style in patterns:
            if pattern.match(path):
                if style not in _STYLES:
                    raise ConfigError(f"tensor_parallel: {type(model).__name__}'s base_model_tp_plan splits {key} "
                                      f"as {style!r}, which zerotrain does not build (it splits {' and '.join(_STYLES)}"
                                      "); train this model without tensor_parallel")
                plan[path] = style
    return plan


def tensor_plan(model: nn.Module, size: int) -> dict[str, str]:
    """The split of `model` over `size` tensor ranks, checked."""
    plan = _zerotrain_plan(model, size) or _hf_plan(model, size)
    if not plan:
        raise ConfigError(f"tensor_parallel: {type(model).__name__} has no tensor-parallel plan (zerotrain splits its "
                          "GPT and BERT, and HF models whose config has a base_model_tp_plan: LLaMA, Qwen, Mistral, "
                          "...); use one of those or remove tensor_parallel (--tensor_parallel_size 1)")
    modules = dict(model.named_modules())
    for path, style in plan.items():
        layer = modules[path]
        if not isinstance(layer, nn.Linear):
            raise ConfigError(f"tensor_parallel: {path} is a {type(layer).__name__}, not a Linear; zerotrain splits "
                              "Linear layers only: train this model without tensor_parallel")
        width, side = (layer.out_features, "output") if style != "rowwise" else (layer.in_features, "input")
        parts = int(style.split(":")[1]) if ":" in style else 1
        if width % (size * parts):
            raise ConfigError(f"tensor_parallel.autotp_size {size}: {path} has {width // parts} {side} features"
                              f"{' per part' if parts > 1 else ''}, not divisible by {size}; {_FIX}")
    return plan
