"""The engine in one process: fp16 / bf16 and non-finite steps."""

from __future__ import annotations
import copy
import json
import logging
import math
import re
import pytest
import torch
from torch import nn
import zerotrain
from zerotrain.errors import ConfigError
from zerotrain.models import GPT, GPTConfig

from engine_helpers import *  # noqa: F401,F403
from engine_helpers import ATOL  # noqa: F401


def test_fp16_dynamic_scale_grows_after_the_window():
    model = mlp()
    cfg = config(fp16={"enabled": True, "initial_scale_power": 4, "loss_scale_window": 2})
    engine, *_ = zerotrain.initialize(model=model, config=cfg)
    assert next(model.parameters()).dtype == torch.float16
    assert engine.loss_scale == 16
    scales = []
    for s in range(5):
        x, y = micro_batch(s)
        engine.backward(mse(engine, x.half(), y))
        engine.step()
        scales.append(engine.loss_scale)
    assert engine.skipped_steps == 0
    # first growth on good step window + 1, then every window good steps
    assert scales == [16, 16, 32, 32, 64]


def test_fp16_trains_like_fp32():
    """Scaling and unscaling must cancel: fp16 training tracks the fp32 loop closely."""
    model = mlp()
    reference = copy.deepcopy(model)
    sgd = {"type": "SGD", "params": {"lr": 0.1}}
    engine, *_ = zerotrain.initialize(model=model, config=config(optimizer=sgd, fp16={"enabled": True}))
    train_engine(engine, 3, 1, dtype=torch.float16)
    train_reference(reference, torch.optim.SGD(reference.parameters(), lr=0.1), 3, 1)
    assert engine.loss_scale == 2.0**16
    assert_same_params(model, reference, atol=5e-3)


def test_fp16_inf_loss_skips_the_step():
    model = mlp()
    cfg = config(fp16={"enabled": True, "initial_scale_power": 8, "hysteresis": 1}, scheduler=warmup_linear())
    engine, optimizer, _, scheduler = zerotrain.initialize(model=model, config=cfg)
    train_engine(engine, 2, 1, dtype=torch.float16)
    before, masters = snapshot(model), [m.detach().clone() for m in optimizer.param_groups[0]["params"]]
    lr, sched_state = engine.get_lr(), dict(scheduler.state_dict())
    x, y = micro_batch(50)
    engine.backward(mse(engine, x.half(), y) * math.inf)
    engine.step()
    assert not math.isfinite(engine.get_global_grad_norm())
    assert engine.skipped_steps == 1
    assert engine.global_steps == 3 and engine.global_samples == 6  # counters still advance
    assert same(snapshot(model), before)
    assert all(torch.equal(m, b) for m, b in zip(optimizer.param_groups[0]["params"], masters))
    assert engine.get_lr() == lr and scheduler.state_dict() == sched_state  # no scheduler step
    assert engine.loss_scale == 128.0  # halved once (hysteresis 1)
    # the next good step trains again, with clean gradients
    train_engine(engine, 1, 1, dtype=torch.float16)
    assert not same(snapshot(model), before)
    assert math.isfinite(engine.get_global_grad_norm())
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert engine.get_lr() != lr


def test_fp16_static_scale_stays_fixed():
    model = mlp()
    engine, *_ = zerotrain.initialize(model=model, config=config(fp16={"enabled": True, "loss_scale": 128}))
    train_engine(engine, 3, 1, dtype=torch.float16)
    assert engine.loss_scale == 128
    x, y = micro_batch(9)
    engine.backward(mse(engine, x.half(), y) * math.inf)
    engine.step()
    assert engine.skipped_steps == 1
    train_engine(engine, 3, 1, dtype=torch.float16)
    assert engine.loss_scale == 128


def test_bf16_trains_on_a_learnable_task():
    torch.manual_seed(0)
    model = nn.Linear(6, 3)
    w_true = torch.randn(6, 3)
    cfg = config(micro=8, optimizer={"type": "AdamW", "params": {"lr": 5e-2, "weight_decay": 0.0}},
                 bf16={"enabled": True})
    engine, *_ = zerotrain.initialize(model=model, config=cfg)
    assert model.weight.dtype == torch.bfloat16
    losses = []
    for s in range(30):
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(s))
        loss = ((engine(x.bfloat16()).float() - x @ w_true) ** 2).mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    assert engine.skipped_steps == 0
    assert sum(losses[-5:]) / 5 < 0.3 * sum(losses[:5]) / 5


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_nan_loss_skips_the_step(precision):
    model = mlp()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    extra = {"bf16": {"enabled": True}} if precision == "bf16" else {}
    engine, _, _, scheduler = zerotrain.initialize(model=model, config=config(scheduler=warmup_linear(), **extra))
    train_engine(engine, 2, 1, dtype=dtype)
    before, lr = snapshot(model), engine.get_lr()
    x, y = micro_batch(7)
    engine.backward(mse(engine, x.to(dtype), y) * math.nan)
    engine.step()
    assert engine.skipped_steps == 1 and engine.global_steps == 3
    assert same(snapshot(model), before)
    assert engine.get_lr() == lr
    assert engine.loss_scale == 1.0
    train_engine(engine, 1, 1, dtype=dtype)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert not same(snapshot(model), before)


@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
def test_consecutive_skips_stop_the_run_at_the_limit_with_the_last_good_state(precision, tmp_path):
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[precision]
    extra = {precision: {"enabled": True}} if precision != "fp32" else {}
    model = mlp()
    engine, *_ = zerotrain.initialize(model=model, config=config(max_consecutive_skipped_steps=3, **extra))
    train_engine(engine, 2, 1, dtype=dtype)
    good = snapshot(model)
    nan_step(engine, 10, dtype)
    nan_step(engine, 11, dtype)
    train_engine(engine, 1, 1, dtype=dtype)  # a good step resets the count
    good = snapshot(model)
    nan_step(engine, 12, dtype)
    nan_step(engine, 13, dtype)
    with pytest.raises(zerotrain.NonFiniteStepsError, match=r"step 8: 3 optimizer steps in a row.*after step 5") as err:
        nan_step(engine, 14, dtype)
    assert err.value.last_good_step == 5
    assert "\n" not in str(err.value)
    assert engine.global_steps == 8 and engine.skipped_steps == 5
    assert same(snapshot(model), good)
    # the state saved after the stop is the last good one, and it loads
    engine.save_checkpoint(tmp_path, tag="halted")
    model2 = mlp(seed=1)
    engine2, *_ = zerotrain.initialize(model=model2, config=config(**extra))
    engine2.load_checkpoint(tmp_path)
    assert same(snapshot(model2), good) and engine2.global_steps == 8


def test_skip_limit_zero_never_stops():
    engine, *_ = zerotrain.initialize(model=mlp(), config=config(max_consecutive_skipped_steps=0))
    for i in range(120):
        nan_step(engine, i)
    assert engine.skipped_steps == 120


def test_skip_limit_defaults_to_100():
    engine, *_ = zerotrain.initialize(model=mlp(), config=config())
    for i in range(99):
        nan_step(engine, i)
    with pytest.raises(zerotrain.NonFiniteStepsError):
        nan_step(engine, 99)

