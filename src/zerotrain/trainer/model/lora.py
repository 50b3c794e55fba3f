"""LoRA through peft: train a low-rank update beside each chosen frozen weight.

        x ──► W (frozen, d_out x d_in) ───────────────┐
        │                                              (+) ──► y = W x + (alpha / r) B A x
        └──► dropout ──► A (r x d_in) ──► B (d_out x r)┘        B starts at 0, so y = W x at step 0

peft's `inject_adapter_in_model` swaps the chosen Linear layers in place, so the engine sees
the model's own class and forward (features inspect that signature) and ZeRO shards only
what requires grad: the A and B matrices plus any `modules_to_save`. The adapter folder
holds adapter_config.json and adapter_model.safetensors in peft's key layout
(`base_model.model.<layer>.lora_A.weight`); `merge` folds B A into W for a plain model.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from ...errors import ConfigError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
OURS_CONFIG = "zerotrain_adapter.json"  # the task and label count merge-lora needs
_OURS_KEYS = ("task", "num_labels")
_PREFIX = "base_model.model."
# LLaMA-style names -> the layer that does that job in models that fuse or rename them.
_ALIASES = {
    "zerotrain": {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "o_proj": "proj",
                  "gate_proj": "fc", "up_proj": "fc", "down_proj": "fc_out"},
    "gpt2": {"q_proj": "c_attn", "k_proj": "c_attn", "v_proj": "c_attn", "o_proj": "attn.c_proj",
             "gate_proj": "c_fc", "up_proj": "c_fc", "down_proj": "mlp.c_proj"},
}
_HEADS = {"lm_head", "decoder", "classifier", "score", "pooler", "dense", "qa_outputs"}


def _linear_names(model: nn.Module) -> list[str]:
    names = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D":
            names.append(name)
    return names


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)


def resolve_targets(model: nn.Module, family: str, spec: str) -> list[str]:
    """Comma list of names (LLaMA-style, the model's own, or "all") -> peft target names."""
    linear = _linear_names(model)
    wanted = [t.strip() for t in spec.split(",") if t.strip()]
    if not wanted:
        raise ConfigError("lora_target_modules: empty; name layers or use all")
    if wanted == ["all"]:
        out = sorted({n.split(".")[-1] for n in linear if n.split(".")[-1] not in _HEADS})
        if not out:
            raise ConfigError(f"lora_target_modules all: {type(model).__name__} has no linear layers to adapt")
        return out
    aliases = _ALIASES.get(family, {})
    out = []
    for target in wanted:
        if not any(_matches(n, target) for n in linear):
            target = aliases.get(target, target)
        if not any(_matches(n, target) for n in linear):
            own = sorted({n.split(".")[-1] for n in linear})
            raise ConfigError(f"lora_target_modules: no linear layer named {target!r} in "
                              f"{type(model).__name__}; its linear layers are {', '.join(own)}")
        if target not in out:
            out.append(target)
    return out


def apply_lora(model: nn.Module, family: str, rank: int, alpha: float | None, dropout: float, targets: str,
               modules_to_save: str | None) -> dict:
    """Inject adapters in place; returns the adapter config (saved beside the weights)."""
    from peft import LoraConfig, inject_adapter_in_model

    if rank < 0:
        raise ConfigError(f"lora_rank: should be >= 0, got {rank}")
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"lora_dropout: should be in [0, 1), got {dropout}")
    saved = [m.strip() for m in (modules_to_save or "").split(",") if m.strip()]
    config = {"r": rank, "lora_alpha": float(alpha if alpha is not None else 2 * rank), "lora_dropout": dropout,
              "target_modules": resolve_targets(model, family, targets), "modules_to_save": saved or None,
              "fan_in_fan_out": family == "gpt2"}
    inject_adapter_in_model(LoraConfig(**{k: v for k, v in config.items() if k != "modules_to_save"}), model)
    for target in saved:
        found = [m for n, m in model.named_modules() if _matches(n, target)]
        if not found:
            raise ConfigError(f"modules_to_save: no module named {target!r} in {type(model).__name__}")
        for module in found:
            module.requires_grad_(True)
    return config


def count_parameters(model: nn.Module) -> tuple[int, int]:
    seen, trainable, total = set(), 0, 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return trainable, total


def adapter_state(state: dict, config: dict) -> dict[str, torch.Tensor]:
    """The adapter's share of a full state dict, in peft's saved key layout."""
    saved = config.get("modules_to_save") or []
    out = {}
    for key, value in state.items():
        if ".lora_A." in key or ".lora_B." in key:
            out[_PREFIX + key.replace(".default.", ".")] = value
        elif any(_matches(key.rsplit(".", 1)[0], m) or f".{m}." in f".{key}" for m in saved):
            out[_PREFIX + key] = value
    return out


def save_adapter(folder: Path, state: dict, config: dict, base: str | None) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in adapter_state(state, config).items()}
    save_file(tensors, str(folder / ADAPTER_WEIGHTS))
    ours = {k: config[k] for k in _OURS_KEYS if k in config}  # peft warns about keys it does not know
    meta = {"peft_type": "LORA", "base_model_name_or_path": base, "bias": "none", "task_type": None,
            **{k: v for k, v in config.items() if k not in _OURS_KEYS}}
    (folder / ADAPTER_CONFIG).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    (folder / OURS_CONFIG).write_text(json.dumps(ours, indent=2) + "\n", encoding="utf-8")


def read_adapter(folder: Path) -> tuple[dict, dict]:
    from safetensors.torch import load_file

    if not (folder / ADAPTER_CONFIG).is_file() or not (folder / ADAPTER_WEIGHTS).is_file():
        raise ConfigError(f"{folder}: not a LoRA adapter folder (needs {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})")
    meta = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    if (folder / OURS_CONFIG).is_file():
        meta.update(json.loads((folder / OURS_CONFIG).read_text(encoding="utf-8")))
    return meta, load_file(str(folder / ADAPTER_WEIGHTS))


def load_adapter(model: nn.Module, folder: Path) -> dict:
    """Inject the saved adapter's layers into `model` and load its weights."""
    from peft import LoraConfig, inject_adapter_in_model

    meta, tensors = read_adapter(folder)
    keys = ("r", "lora_alpha", "lora_dropout", "target_modules", "fan_in_fan_out")
    inject_adapter_in_model(LoraConfig(**{k: meta[k] for k in keys if k in meta}), model)
    state = {}
    for key, value in tensors.items():
        key = key[len(_PREFIX):] if key.startswith(_PREFIX) else key
        for part in (".lora_A.", ".lora_B."):
            key = key.replace(part, f"{part}default.") if part in key and f"{part}default." not in key else key
        state[key] = value
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected:
        raise ConfigError(f"{folder}: adapter weights do not fit the base model (e.g. {unexpected[0]})")
    return meta


def merge(model: nn.Module) -> int:
    """Fold every LoRA layer into its base weight and put the plain layer back; returns how many."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    swaps = [(name, m) for name, m in model.named_modules() if isinstance(m, BaseTunerLayer)]
    for name, module in swaps:
        module.merge()
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, module.get_base_layer())
    return len(swaps)
