"""The engine in one process: gradient accumulation, clipping, param groups and user zero_grad, against plain loops."""

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


def test_backward_scales_the_loss_by_one_over_ga():
    model = mlp()
    reference = copy.deepcopy(model)
    engine, *_ = zerotrain.initialize(model=model, config=config(ga=4))
    x, y = micro_batch(0)
    loss = mse(engine, x, y)
    returned = engine.backward(loss)
    assert returned is loss  # the unscaled loss comes back
    mse(reference, x, y).backward()
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, r.grad / 4, rtol=0, atol=1e-7)


@pytest.mark.parametrize("opt", ["AdamW", "SGD"])
def test_gradient_accumulation_matches_the_plain_loop(opt):
    model = mlp()
    reference = copy.deepcopy(model)
    opt_cfg = ({"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}} if opt == "AdamW"
               else {"type": "SGD", "params": {"lr": 0.1}})
    engine, *_ = zerotrain.initialize(model=model, config=config(ga=4, optimizer=opt_cfg))
    assert engine.gradient_accumulation_steps() == 4 and engine.train_batch_size() == 8
    start = snapshot(model)
    boundaries = []
    for s in range(2):
        for m in range(4):
            boundaries.append(engine.is_gradient_accumulation_boundary())
            x, y = micro_batch(s * 4 + m)
            engine.backward(mse(engine, x, y))
            engine.step()
            micro = s * 4 + m + 1
            assert engine.micro_steps == micro
            assert engine.global_steps == micro // 4
            assert engine.global_samples == (micro // 4) * 8
            if micro < 4:
                assert same(snapshot(model), start), f"params moved after micro-step {micro}"
            if micro == 4:
                assert not same(snapshot(model), start), "no update at the boundary"
    assert boundaries == [False, False, False, True] * 2
    ref_opt = adamw(reference.parameters()) if opt == "AdamW" else torch.optim.SGD(reference.parameters(), lr=0.1)
    train_reference(reference, ref_opt, steps=2, ga=4)
    assert_same_params(model, reference)


def test_clipping_uses_the_global_norm_and_matches_clip_grad_norm():
    model = mlp()
    reference = copy.deepcopy(model)
    sgd = {"type": "SGD", "params": {"lr": 0.5}}
    engine, *_ = zerotrain.initialize(model=model, config=config(ga=2, optimizer=sgd, gradient_clipping=0.05))
    norms = []
    for s in range(3):
        for m in range(2):
            x, y = micro_batch(s * 2 + m)
            engine.backward(mse(engine, x, y))
            engine.step()
        norms.append(engine.get_global_grad_norm())
    ref_norms = train_reference(reference, torch.optim.SGD(reference.parameters(), lr=0.5), 3, 2, clip=0.05)
    assert all(n > 0.05 for n in ref_norms)  # clipping was active on every step
    assert norms == pytest.approx(ref_norms, rel=1e-6)
    assert_same_params(model, reference)


def test_fused_optimizer_applies_the_clip_factor_itself(monkeypatch):
    """With torch's fused AdamW the unscale x clip factor travels as `grad_scale` into the
    kernel rather than as a pass over the gradients; the result is clip_grad_norm_'s."""
    model = mlp()
    reference = copy.deepcopy(model)
    adam = {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}}
    engine, *_ = zerotrain.initialize(model=model, config=config(optimizer=adam, gradient_clipping=0.05))
    assert engine.optimizer.defaults["fused"]
    factors = []
    prepare = engine.strategy.prepare_step
    monkeypatch.setattr(engine.strategy, "prepare_step", lambda coef: (factors.append(coef), prepare(coef)))
    train_engine(engine, 3, 1)
    ref_norms = train_reference(reference, torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.01,
                                                             fused=True), 3, 1, clip=0.05)
    assert all(n > 0.05 for n in ref_norms)
    assert factors == [1.0, 1.0, 1.0]  # the gradients themselves were never scaled
    assert not hasattr(engine.optimizer, "grad_scale")
    assert_same_params(model, reference)


def test_clipping_zero_disables_it():
    model = mlp()
    ref_plain, ref_clipped = copy.deepcopy(model), copy.deepcopy(model)
    sgd = {"type": "SGD", "params": {"lr": 0.5}}
    engine, *_ = zerotrain.initialize(model=model, config=config(optimizer=sgd, gradient_clipping=0.0))
    train_engine(engine, 3, 1)
    norms = train_reference(ref_plain, torch.optim.SGD(ref_plain.parameters(), lr=0.5), 3, 1)
    train_reference(ref_clipped, torch.optim.SGD(ref_clipped.parameters(), lr=0.5), 3, 1, clip=0.05)
    assert all(n > 0.05 for n in norms)
    assert engine.get_global_grad_norm() == pytest.approx(norms[-1], rel=1e-6)
    assert_same_params(model, ref_plain)
    with pytest.raises(AssertionError):
        assert_same_params(model, ref_clipped)


def test_default_clipping_is_one():
    model = mlp()
    cfg = config(optimizer={"type": "SGD", "params": {"lr": 0.5}})
    del cfg["gradient_clipping"]
    reference = copy.deepcopy(model)
    engine, *_ = zerotrain.initialize(model=model, config=cfg)
    # scale the targets so the gradient norm is well above 1
    x, y = micro_batch(0)
    engine.backward(mse(engine, x, 40 * y))
    engine.step()
    opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    mse(reference, x, 40 * y).backward()
    norm = float(torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0))
    opt.step()
    assert norm > 1.0
    assert engine.get_global_grad_norm() == pytest.approx(norm, rel=1e-6)
    assert_same_params(model, reference)


def test_param_groups_keep_their_own_lr():
    model = mlp()
    reference = copy.deepcopy(model)
    groups = [{"params": model[0].parameters(), "lr": 0.2},
              {"params": model[2].parameters(), "lr": 0.01}]
    sgd = {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}}
    engine, *_ = zerotrain.initialize(model=model, model_parameters=groups, config=config(optimizer=sgd))
    assert engine.get_lr() == [0.2, 0.01]
    train_engine(engine, 3, 1)
    ref_opt = torch.optim.SGD([{"params": reference[0].parameters(), "lr": 0.2},
                               {"params": reference[2].parameters(), "lr": 0.01}], lr=0.05, momentum=0.9)
    train_reference(reference, ref_opt, 3, 1)
    assert engine.get_lr() == [0.2, 0.01]
    assert_same_params(model, reference)


@pytest.mark.parametrize("ga", [1, 2])
def test_user_zero_grad_between_steps(ga):
    model = mlp()
    reference = copy.deepcopy(model)
    engine, *_ = zerotrain.initialize(model=model, config=config(ga=ga))
    train_engine(engine, 4, ga, between=lambda: model.zero_grad(set_to_none=True))
    assert all(p.grad is None for p in model.parameters())  # the last call left them None
    train_reference(reference, adamw(reference.parameters()), 4, ga)
    assert_same_params(model, reference)
    # after the next backward the gradients live in the flat buffer again
    x, y = micro_batch(99)
    engine.backward(mse(engine, x, y))
    buffer = engine.strategy.flat.grad_buffers[0]
    lo, hi = buffer.data_ptr(), buffer.data_ptr() + buffer.numel() * buffer.element_size()
    for p in model.parameters():
        assert lo <= p.grad.data_ptr() < hi
    assert buffer.abs().sum() > 0


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_user_optimizer_zero_grad_between_steps(precision):
    """Habit from plain PyTorch: `optimizer.zero_grad()` (set_to_none) on the returned optimizer.
    The engine must still step with this step's gradients, as DeepSpeed's returned optimizers do."""
    model = mlp()
    reference = copy.deepcopy(model)
    dtype = torch.float16 if precision == "fp16" else torch.float32
    extra = {"fp16": {"enabled": True}} if precision == "fp16" else {}
    sgd = {"type": "SGD", "params": {"lr": 0.1}}
    engine, optimizer, _, _ = zerotrain.initialize(model=model, config=config(optimizer=sgd, **extra))
    for s in range(3):
        optimizer.zero_grad()
        x, y = micro_batch(s)
        engine.backward(mse(engine, x.to(dtype), y))
        engine.step()
    train_reference(reference, torch.optim.SGD(reference.parameters(), lr=0.1), 3, 1)
    assert engine.skipped_steps == 0
    assert_same_params(model, reference, atol=ATOL if precision == "fp32" else 5e-3)

