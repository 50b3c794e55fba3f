"""FusedAdam and DeepSpeedCPUAdam build torch's Adam family with DeepSpeed's arguments."""

import torch

from zerotrain.ops.adam import DeepSpeedCPUAdam, FusedAdam
from zerotrain.optim.uncorrected_adam import UncorrectedAdam


def _params():
    return [torch.nn.Parameter(torch.ones(3))]


def test_the_class_follows_the_mode_and_bias_correction():
    assert type(FusedAdam(_params(), lr=0.1)) is torch.optim.AdamW
    assert type(FusedAdam(_params(), adam_w_mode=False)) is torch.optim.Adam
    assert type(DeepSpeedCPUAdam(_params(), adamw_mode=False)) is torch.optim.Adam
    assert type(FusedAdam(_params(), bias_correction=False)) is UncorrectedAdam


def test_settings_and_groups_carry_over():
    w, b = _params()[0], _params()[0]
    opt = FusedAdam([{"params": [w]}, {"params": [b], "weight_decay": 0.0}], lr=0.5, betas=[0.8, 0.9],
                    weight_decay=0.1)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert opt.param_groups[0]["lr"] == 0.5 and opt.param_groups[0]["betas"] == (0.8, 0.9)
    w.grad = torch.ones(3)
    opt.step()
    assert not torch.equal(w.detach(), torch.ones(3))
