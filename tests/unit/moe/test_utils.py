"""zerotrain.moe.utils for models without expert layers: the optimizer groups come back as
they are, and an expert parameter (DeepSpeed's allreduce=False) is refused in one line."""

from __future__ import annotations

import pytest
import torch

from zerotrain.errors import NotBuiltError
from zerotrain.moe.utils import is_moe_param, split_params_into_different_moe_groups_for_optimizer as split


def test_groups_without_experts_come_back_as_given():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    group = {"params": model.parameters(), "name": "parameters", "lr": 0.1}
    out = split(group)
    assert out == [group] and out[0]["params"] == list(model.parameters()) and out[0]["lr"] == 0.1
    groups = ({"params": [model[0].weight]}, {"params": [model[1].weight], "weight_decay": 0.0})
    assert split(groups) == list(groups)
    assert not any(is_moe_param(p) for p in model.parameters())


def test_an_expert_parameter_is_refused_naming_it():
    model = torch.nn.Linear(3, 2)
    model.bias.allreduce, model.bias.group_name = False, "ep_size_2"
    assert is_moe_param(model.bias)
    with pytest.raises(ValueError) as info:
        split([{"params": list(model.parameters()), "name": "dense"}])
    message = str(info.value)
    assert "\n" not in message
    assert "param group 'dense', parameter 1 (shape (2,), expert group 'ep_size_2') is an expert parameter" in message


def test_a_group_that_is_not_one_is_refused():
    with pytest.raises(TypeError, match="each param group must be a dict with 'params'"):
        split([torch.nn.Linear(2, 2).weight])


def test_expert_layers_stay_refused_by_name():
    for statement in ("from zerotrain.moe.layer import MoE", "import zerotrain.moe; zerotrain.moe.layer.MoE",
                      "from zerotrain.moe.sharded_moe import TopKGate"):
        with pytest.raises(NotBuiltError, match=r"not in zerotrain \(there are no expert \(MoE\) layers\)"):
            exec(statement)
