"""The BERT PLD recipe's "warmup linear decay exp" (spec 9.2) through get_scheduler and the trainer
option, against golden values written here from the spec text alone."""

from __future__ import annotations

import pytest
import torch

from zerotrain.errors import ConfigError
from zerotrain.schedules import SCHEDULER_TYPES, get_scheduler

LRS = (1e-3, 4e-4)


def golden(s: int, W: int, T: int, rate: float, k: float) -> float:
    """Spec 9.2 with w = W / T: a ramp s/W to the end of warmup, then rate per k steps; 1 when W is 0."""
    if W == 0:
        return 1.0
    if s < W:
        return s / W
    return rate ** ((s - W) / k)


def _opt():
    return torch.optim.SGD([{"params": [torch.nn.Parameter(torch.zeros(2))], "lr": lr} for lr in LRS], lr=LRS[0])


GRID = [(20, 1000, 0.99, 1000), (2, 100, 0.99, 10), (7, 50, 0.5, 3), (1, 5, 0.9, 1), (0, 40, 0.9, 2),
        (10, 10, 0.8, 4), (3, 200, 1.0, 1000)]


@pytest.mark.parametrize("W,T,rate,k", GRID)
def test_every_step_matches_the_spec_formula(W, T, rate, k):
    opt = _opt()
    sched = get_scheduler("warmup_linear_decay_exp", opt, W, T, decay_rate=rate, decay_steps=k)
    for s in range(T + 20):  # past T the decay goes on, as the recipe's formula does
        if s:
            opt.step()
            sched.step()
        want = golden(s, W, T, rate, k)
        for group, lr in zip(opt.param_groups, LRS):
            assert group["lr"] == pytest.approx(lr * want, rel=1e-9, abs=0), (W, T, s)


def test_seed_recipe_values_and_the_zero_warmup_quirk():
    # the seed: 2% warmup, 0.99 every 1000 steps; with T = 100k warmup ends at step 2000
    opt = _opt()
    sched = get_scheduler("warmup_linear_decay_exp", opt, 2000, 100_000,
                          scheduler_specific_kwargs={"decay_rate": 0.99, "decay_steps": 1000})
    assert sched.lr_lambdas[0](1000) == pytest.approx(0.5, rel=1e-12)
    assert sched.lr_lambdas[0](2000) == 1.0
    assert sched.lr_lambdas[0](3000) == pytest.approx(0.99, rel=1e-12)
    assert sched.lr_lambdas[0](12_000) == pytest.approx(0.99 ** 10, rel=1e-12)
    # no warmup: 1 at every step, the decay never starts (documented quirk)
    flat = get_scheduler("warmup_linear_decay_exp", _opt(), 0, 100, decay_rate=0.5, decay_steps=1)
    assert {flat.lr_lambdas[0](s) for s in range(0, 300, 7)} == {1.0}


def test_defaults_are_the_seeds_and_kwargs_are_checked():
    assert "warmup_linear_decay_exp" in SCHEDULER_TYPES
    sched = get_scheduler("warmup_linear_decay_exp", _opt(), 10, 10_000)  # decay 0.99 per 1000 by default
    assert sched.lr_lambdas[0](1010) == pytest.approx(0.99, rel=1e-12)
    with pytest.raises(ConfigError, match="decay_rat"):
        get_scheduler("warmup_linear_decay_exp", _opt(), 10, 100, decay_rat=0.9)
    with pytest.raises(ValueError, match="decay_rate"):
        get_scheduler("warmup_linear_decay_exp", _opt(), 10, 100, decay_rate=1.5)
    with pytest.raises(ValueError, match="decay_steps"):
        get_scheduler("warmup_linear_decay_exp", _opt(), 10, 100, decay_steps=0)
    with pytest.raises(ValueError, match="num_training_steps"):
        get_scheduler("warmup_linear_decay_exp", _opt(), 10)


def test_trainer_option_builds_it(tmp_path):
    from zerotrain.trainer.args import build
    from zerotrain.trainer.preflight import check_deepspeed_config

    _, _, train = build({"output_dir": str(tmp_path / "o"), "lr_scheduler_type": "warmup_linear_decay_exp",
                         "lr_scheduler_kwargs": '{"decay_rate": 0.99, "decay_steps": 1000}', "warmup_ratio": "0.02"})
    assert train.lr_scheduler_kwargs == {"decay_rate": 0.99, "decay_steps": 1000}
    check_deepspeed_config(train, set(), 1, 64)  # builds the schedule on a stand-in optimizer
    train.lr_scheduler_kwargs = {"decay_steps": -1}
    with pytest.raises(ConfigError, match="lr_scheduler_type warmup_linear_decay_exp: decay_steps"):
        check_deepspeed_config(train, set(), 1, 64)
