"""`engine.save_16bit_model`: the trained weights as one plain file, for inference or the hub.

    engine.save_16bit_model("out")                           out/pytorch_model.bin  (torch.save)
    engine.save_16bit_model("out", "model.safetensors")      safetensors, by the name's suffix

The weights are the module's own, in its compute dtype (fp16/bf16 under mixed precision, as
DeepSpeed writes them), whole at every stage: ZeRO-3 gathers them through the engine's full
state dict, so every rank must call. Rank 0 writes, atomically; the others wait, so the file
is there for all once it returns. Either file loads with plain torch (`torch.load`,
`safetensors.torch.load_file`) and with transformers' `from_pretrained` beside a config.json.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..checkpoint.safetensors_out import save_safetensors
from ..errors import ConfigError


def frozen_names(module: torch.nn.Module) -> set[str]:
    """State-dict names of the parameters that do not train (every alias of a tied one)."""
    return {name for name, p in module.named_parameters(remove_duplicate=False) if not p.requires_grad}


def check_save_dir(save_dir, what: str) -> Path:
    """Every rank checks before any collective, so a bad folder fails everywhere at once."""
    if save_dir is None or str(save_dir).strip() == "":
        raise ConfigError(f"{what}: save_dir is {save_dir!r}; give the folder to write into")
    return Path(save_dir)


def save_16bit_model(engine, save_dir, save_filename: str = "pytorch_model.bin",
                     exclude_frozen_parameters: bool = False) -> bool:
    folder = check_save_dir(save_dir, "save_16bit_model")
    if not save_filename or Path(save_filename).name != save_filename:
        raise ConfigError(f"save_16bit_model: save_filename {save_filename!r} must be a file name "
                          "(the folder goes in save_dir)")
    state = engine.module_state_dict()  # a collective at stage 3
    if exclude_frozen_parameters:
        frozen = frozen_names(engine.module)
        state = {k: v for k, v in state.items() if k not in frozen}
    if engine.comm.rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / save_filename
        if target.suffix == ".safetensors":
            save_safetensors(state, target, overwrite=True)
        else:
            # own storage per tensor: a view into a flat buffer would save the whole buffer
            tensors = {k: v.detach().clone(memory_format=torch.contiguous_format) for k, v in state.items()}
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            try:
                torch.save(tensors, tmp)
                os.replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)
    engine.comm.barrier()
    return True
