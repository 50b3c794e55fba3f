"""The one filler of "auto" values, for both routes (initialize and the trainer).

    "auto" at a path the caller has a value for   -> that value (the trainer passes the
                                                     values of its options, HF's way)
    "auto" inside fp16, bf16, zero_optimization   -> the key is dropped, so the default
                                                     applies: DeepSpeed's config blocks drop
                                                     "auto" the same way (e.g.
                                                     stage3_gather_16bit_weights_on_model_save
                                                     "auto" is false)
    "auto" anywhere else                          -> an error naming the key (keep_unfilled
                                                     leaves it for a later pass instead)
"""

from __future__ import annotations

import copy
from typing import Any

from ..errors import ConfigError

# Blocks that DeepSpeed validates with its pydantic models, which ignore "auto" values.
DEFAULTING_BLOCKS = ("fp16", "bf16", "bfloat16", "zero_optimization", "pipeline")

# What `zerotrain train` and `zerotrain.Trainer` fill in, from which option (HF Trainer's list,
# plus the curriculum's length): for error messages and `zerotrain config`.
TRAINER_FILLS = {
    "train_micro_batch_size_per_gpu": "per_device_train_batch_size",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "train_batch_size": "per_device_train_batch_size x gradient_accumulation_steps x processes",
    "gradient_clipping": "max_grad_norm",
    "fp16.enabled": "fp16",
    "bf16.enabled": "bf16",
    "bfloat16.enabled": "bf16",
    "optimizer.params.lr": "learning_rate",
    "optimizer.params.betas": "adam_beta1, adam_beta2",
    "optimizer.params.eps": "adam_epsilon",
    "optimizer.params.weight_decay": "weight_decay",
    "scheduler.params.warmup_min_lr": "0 (always, as HF)",
    "scheduler.params.warmup_max_lr": "learning_rate",
    "scheduler.params.warmup_num_steps": "warmup_steps / warmup_ratio (0: no warmup)",
    "scheduler.params.total_num_steps": "max_steps / num_train_epochs",
    "zero_optimization.reduce_bucket_size": "the model's hidden size squared",
    "zero_optimization.stage3_prefetch_bucket_size": "0.9 x the model's hidden size squared",
    "zero_optimization.stage3_param_persistence_threshold": "10 x the model's hidden size",
    "curriculum_learning.max_difficulty": "block_size",
    "amp.enabled": "false (there is no apex AMP)",
}


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _defaults(path: str, value: Any) -> bool:
    """An "auto" inside a defaulting block (not the block itself): dropped, the default applies."""
    return isinstance(value, str) and value == "auto" and "." in path and path.split(".")[0] in DEFAULTING_BLOCKS


def fill_auto(node: dict, values: dict[str, Any] | None = None, *, keep_unfilled: bool = False,
              sources: dict[str, str] | None = None, opaque: tuple[str, ...] = ()) -> dict:
    """A copy of `node` with every "auto" resolved as the module docstring says. `sources`,
    when given, receives {dotted path: how its "auto" was resolved}; the top-level keys in
    `opaque` (blocks nothing reads) are copied as they are."""
    values = values or {}
    sources = sources if sources is not None else {}

    def walk(value: Any, path: str) -> Any:
        if path in opaque:
            return copy.deepcopy(value)
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                sub = _join(path, k)
                if _defaults(sub, v) and sub not in values and not keep_unfilled:
                    sources[sub] = "auto: default"
                    continue
                out[k] = walk(v, sub)
            return out
        if isinstance(value, list):
            return [walk(v, f"{path}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, str) and value == "auto":
            if path in values:
                sources[path] = "auto: filled in"
                return copy.deepcopy(values[path])
            if keep_unfilled:
                return value
            raise ConfigError(unfilled_message(path))
        return value

    return walk(node, "")


def unfilled_message(path: str) -> str:
    option = TRAINER_FILLS.get(path)
    if option is not None:
        return (f"{path} is 'auto', which only the Trainer fills in (zerotrain train, zerotrain.Trainer: "
                f"from {option}); give a number")
    return f"{path} is 'auto', which nothing fills in; give a value"


def autos_left(node: Any, path: str = "") -> list[str]:
    """Dotted paths still "auto" that fill_auto would refuse (the defaulting blocks excepted)."""
    found = []
    if isinstance(node, dict):
        for k, v in node.items():
            sub = _join(path, k)
            if _defaults(sub, v):
                continue
            found += autos_left(v, sub)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found += autos_left(v, f"{path}[{i}]")
    elif isinstance(node, str) and node == "auto":
        found.append(path)
    return found
