"""`initialize(mpu=...)`: a Megatron-style model-parallel unit, honoured.

DeepSpeed's engine takes from the mpu the data-parallel group (ZeRO reduces and shards over
it) and the model-parallel group (the gradient norm and the overflow check span it). So does
zerotrain. Each parameter counts once in the norm, DeepSpeed's rule: a parameter marked as
split across tensor-parallel ranks (`tensor_model_parallel` or `model_parallel` true) counts on
every rank; any other is a replica and counts on tensor-parallel rank 0 only.
"""

from __future__ import annotations

from ..comm import Comm
from ..errors import ConfigError
from .split import ModelSplit


def _call(mpu, *names):
    for name in names:
        fn = getattr(mpu, name, None)
        if callable(fn):
            return fn()
    raise ConfigError(f"mpu: {type(mpu).__name__} has none of {', '.join(names)}; pass Megatron's mpu "
                      "(parallel_state) or an object with those methods")


def mpu_split(mpu, state, model) -> ModelSplit:
    data_comm = Comm.subgroup(state, _call(mpu, "get_data_parallel_group"))
    model_comm = Comm.subgroup(state, _call(mpu, "get_model_parallel_group", "get_tensor_model_parallel_group"))
    tensor_rank = _call(mpu, "get_tensor_model_parallel_rank", "get_slice_parallel_rank", "get_model_parallel_rank")
    if data_comm.world_size * model_comm.world_size != state.world_size:
        raise ConfigError(f"mpu: data-parallel size {data_comm.world_size} x model-parallel size "
                          f"{model_comm.world_size} != world size {state.world_size}")

    def uncounted() -> list:
        if tensor_rank == 0:
            return []
        return [p for p in model.parameters() if p.requires_grad
                and not (getattr(p, "tensor_model_parallel", False) or getattr(p, "model_parallel", False))]

    return ModelSplit(data_comm, model_comm, uncounted=uncounted)
