"""A saved model into a stage-3 run without ever being whole on a rank.

At ZeRO stage 3 the trainer builds the model from its config under `zerotrain.zero.Init()`
(each module whole only while it is built) and then reads the weight files one tensor at a
time: each rank keeps its own chunk of each parameter (the layout's cut, the same one
zero.Init made) and drops the rest, so no collective runs and the peak is one tensor. Plain
parameters and buffers (too small to cut, or made outside zero.Init) are copied whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from ...errors import ConfigError
from ...zero.layout import cut
from ...zero.stage3.init import full_shape, is_partitioned

_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def weight_files(folder: Path) -> list[Path]:
    """The files holding a saved model's weights, sharded (an index) or not."""
    for index in _INDEXES:
        if (folder / index).is_file():
            names = json.loads((folder / index).read_text(encoding="utf-8"))["weight_map"].values()
            return [folder / n for n in dict.fromkeys(names)]
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return [folder / name]
    raise ConfigError(f"{folder}: no model weights (model.safetensors, pytorch_model.bin or a sharded index)")


def tensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) one at a time: safetensors are read per tensor, .bin files memory-mapped."""
    from safetensors import safe_open

    for file in weight_files(folder):
        if file.suffix == ".safetensors":
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():
                    yield key, f.get_tensor(key)
        else:
            state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
            for key in list(state):
                yield key, state.pop(key)


def _targets(model: nn.Module) -> tuple[dict[str, torch.Tensor], set[str]]:
    """Every name a state dict of `model` has (tied aliases included), and which are aliases;
    found without touching the partitioned parameters (model.state_dict() would use them)."""
    targets, seen, aliases = {}, set(), set()
    for name, p in model.named_parameters(remove_duplicate=False):
        targets[name] = p
        if id(p) in seen:
            aliases.add(name)
        seen.add(id(p))
    for mod_name, mod in model.named_modules(remove_duplicate=False):
        for name, b in mod._buffers.items():
            if b is not None and name not in mod._non_persistent_buffers_set:
                targets[f"{mod_name}.{name}" if mod_name else name] = b
    return targets, aliases


def _name_in(key: str, targets: dict, prefix: str) -> str | None:
    """A saved name in this model: as it is, or across the base model's prefix (a base model's
    weights into a model with a head, or the other way)."""
    if key in targets:
        return key
    if prefix and key.startswith(prefix + ".") and key[len(prefix) + 1:] in targets:
        return key[len(prefix) + 1:]
    if prefix and f"{prefix}.{key}" in targets:
        return f"{prefix}.{key}"
    return None


def stream_weights(model: nn.Module, folder: Path, rank: int, world_size: int) -> tuple[list[str], list[str]]:
    """Fill `model` (built under zero.Init) from `folder`'s weight files, each rank its chunks;
    returns (missing, unexpected) names as load_state_dict(strict=False) would."""
    targets, aliases = _targets(model)
    prefix = getattr(model, "base_model_prefix", "") or ""
    loaded, unexpected = set(), []
    for key, tensor in tensors(folder):
        name = _name_in(key, targets, prefix)
        if name is None:
            unexpected.append(key)
            continue
        target = targets[name]
        if tuple(tensor.shape) != tuple(full_shape(target)):
            raise ConfigError(f"{folder}: {key} has shape {tuple(tensor.shape)} there and "
                              f"{tuple(full_shape(target))} in this model; build the model with the config (and "
                              "tokenizer) those weights were trained with")
        with torch.no_grad():
            if is_partitioned(target):
                target.zt_chunk.copy_(cut(tensor.reshape(-1), world_size)[rank])
            else:
                target.copy_(tensor)
        loaded.add(id(target))
        del tensor
    missing = [n for n, t in targets.items() if id(t) not in loaded and n not in aliases]
    return missing, unexpected
