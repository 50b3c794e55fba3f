"""`deepspeed.moe.utils` for models without expert layers, the only models zerotrain trains.

DeepSpeed marks an expert's parameter with `allreduce = False` (its gradient is reduced over
the expert-parallel group, not the data-parallel one) and `group_name` (that group), and
`split_params_into_different_moe_groups_for_optimizer` moves such parameters into optimizer
groups of their own. A script calls it whether or not it built expert layers (DeepSpeedExamples'
CIFAR script does with `--moe-param-group`). Without expert parameters the split has nothing
to move: the groups come back as given. An expert parameter cannot come from zerotrain (it has
no `MoE` layer), only from another library's layer; training it as a dense parameter would
average its gradient over ranks that hold other experts, so it is refused in one line.
"""

from __future__ import annotations

from typing import Any

import torch

from ..helpers.refusals import missing

__all__ = ["is_moe_param", "split_params_into_different_moe_groups_for_optimizer"]


def is_moe_param(param: torch.Tensor) -> bool:
    """True for a parameter DeepSpeed treats as an expert's (`param.allreduce` is False)."""
    return getattr(param, "allreduce", True) is False


def split_params_into_different_moe_groups_for_optimizer(param_groups, max_group_size: int | float | None = 178956971
                                                         ) -> list[dict[str, Any]]:
    """The optimizer groups with expert parameters split out; with none (every zerotrain
    model), `param_groups` as a list of the same group dicts. `max_group_size` would cut the
    expert groups into pieces of at most that many elements; there are none to cut."""
    if isinstance(param_groups, dict):
        groups = [param_groups]
    elif isinstance(param_groups, (list, tuple)):
        groups = list(param_groups)
    else:
        raise TypeError("split_params_into_different_moe_groups_for_optimizer: param_groups must be a dict or a "
                        f"list/tuple of dicts with 'params' (got {type(param_groups).__name__})")
    for gi, group in enumerate(groups):
        if not isinstance(group, dict) or "params" not in group:
            raise TypeError("split_params_into_different_moe_groups_for_optimizer: each param group must be a dict "
                            f"with 'params' (group {gi} is {type(group).__name__})")
        group["params"] = list(group["params"])
        for pi, param in enumerate(group["params"]):
            if is_moe_param(param):
                name = group.get("name", gi)
                raise ValueError(
                    f"split_params_into_different_moe_groups_for_optimizer: param group {name!r}, parameter {pi} "
                    f"(shape {tuple(param.shape)}, expert group {getattr(param, 'group_name', '?')!r}) is an expert "
                    "parameter (allreduce=False); zerotrain has no expert (MoE) layers and would average its "
                    "gradient over every rank: train the model without expert layers")
    return groups


__getattr__ = missing(__name__, way="zerotrain.moe.utils has is_moe_param and "
                      "split_params_into_different_moe_groups_for_optimizer (there are no expert (MoE) layers)")
