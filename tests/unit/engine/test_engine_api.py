"""The engine in one process: client optimizers and schedulers, accessors, the data loader and refusals."""

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


def test_client_optimizer_instance():
    model = mlp()
    reference = copy.deepcopy(model)
    client = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    engine, optimizer, _, _ = zerotrain.initialize(model=model, optimizer=client, config=no_optimizer_config())
    assert optimizer is client
    train_engine(engine, 3, 1)
    train_reference(reference, torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9), 3, 1)
    assert_same_params(model, reference)


def test_client_optimizer_callable():
    model = mlp()
    reference = copy.deepcopy(model)
    built = []

    def factory(groups):
        built.append(adamw(groups))
        return built[-1]

    engine, optimizer, _, _ = zerotrain.initialize(model=model, optimizer=factory, config=no_optimizer_config())
    assert optimizer is built[0]
    train_engine(engine, 3, 1)
    train_reference(reference, adamw(reference.parameters()), 3, 1)
    assert_same_params(model, reference)


def test_client_scheduler_instance_built_before_initialize_drives_the_lr():
    model = mlp()
    reference = copy.deepcopy(model)
    client = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(client, step_size=1, gamma=0.5)
    engine, _, _, scheduler = zerotrain.initialize(model=model, optimizer=client, lr_scheduler=sched,
                                                   config=no_optimizer_config())
    assert scheduler is sched
    lrs = []
    for s in range(3):
        train_engine_one(engine, s)
        lrs.append(engine.get_lr())
    assert lrs == [[pytest.approx(0.1 * 0.5**k)] for k in (1, 2, 3)]
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    train_reference(reference, ref_opt, 3, 1,
                    scheduler=torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5))
    assert_same_params(model, reference)


def test_client_scheduler_callable():
    model = mlp()
    made = []

    def factory(optimizer):
        made.append(torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1)))
        return made[-1]

    cfg = config(optimizer={"type": "SGD", "params": {"lr": 0.3}})
    engine, optimizer, _, scheduler = zerotrain.initialize(model=model, lr_scheduler=factory, config=cfg)
    assert scheduler is made[0] and scheduler.optimizer is optimizer
    assert engine.get_lr() == [pytest.approx(0.3)]
    for s in range(3):
        train_engine_one(engine, s)
        assert engine.get_lr() == [pytest.approx(0.3 / (s + 2))]


def test_config_warmup_lr_follows_the_schedule():
    model = mlp()
    engine, *_ = zerotrain.initialize(model=model, config=config(scheduler=warmup_linear(1e-2, 4)))
    assert engine.get_lr() == [0.0]
    got = []
    for s in range(6):
        train_engine_one(engine, s)
        got.append(engine.get_lr()[0])
    # DeepSpeed's linear warmup: after step k the iteration is k-1, lr = max * min(1, (k-1)/4)
    assert got == pytest.approx([1e-2 * min(1.0, k / 4) for k in range(6)])


def test_modes_and_accessors():
    model = mlp()
    engine, *_ = zerotrain.initialize(model=model, config=config(micro=3, ga=2))
    assert engine.module is model
    assert (engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(),
            engine.gradient_accumulation_steps()) == (6, 3, 2)
    assert engine.eval() is engine and not model.training
    assert engine.train() is engine and model.training
    engine.train(False)
    assert not model.training
    assert (engine.global_steps, engine.global_samples, engine.micro_steps, engine.skipped_steps) == (0, 0, 0, 0)
    assert engine.get_global_grad_norm() is None


def test_initialize_returns_a_dataloader_of_micro_batches():
    data = torch.utils.data.TensorDataset(torch.arange(10.0).unsqueeze(1), torch.arange(10))
    engine, _, loader, _ = zerotrain.initialize(model=nn.Linear(1, 1), training_data=data,
                                                config=config(micro=2, ga=2))
    assert loader is not None and engine.training_dataloader is loader
    batches = list(loader)
    assert len(batches) == 5 and all(b[0].shape == (2, 1) for b in batches)
    assert sorted(torch.cat([b[1] for b in batches]).tolist()) == list(range(10))
    _, _, none, _ = zerotrain.initialize(model=nn.Linear(1, 1), config=config())
    assert none is None


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stage_is_built_or_refused_by_name(stage):
    """A stage this version implements builds that stage; any other is a ConfigError naming it
    (never a silent fallback to stage 0)."""
    from zerotrain.zero import STRATEGIES

    cfg = config(zero_optimization={"stage": stage})
    if stage in STRATEGIES:
        engine, *_ = zerotrain.initialize(model=mlp(), config=cfg)
        assert engine.strategy.stage == stage
    else:
        with pytest.raises(ConfigError, match=f"stage {stage}"):
            zerotrain.initialize(model=mlp(), config=cfg)


@pytest.mark.parametrize("block", [
    {"curriculum_learning": {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8,
                             "max_difficulty": 16, "schedule_type": "fixed_linear",
                             "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8}}},
    {"progressive_layer_drop": {"enabled": True}},
], ids=["curriculum_learning", "progressive_layer_drop"])
def test_enabled_feature_blocks_are_never_ignored(block):
    """An enabled block either attaches a feature to the engine or, in a version that does not
    run it yet, is refused with a ConfigError naming the block; it is never silently dropped."""
    name = next(iter(block))
    try:
        engine, *_ = zerotrain.initialize(model=tiny_gpt(), config=gpt_config(**block))
    except ConfigError as err:
        assert name in str(err)
    else:
        assert engine.features, f"{name} enabled but no feature attached"
    # the same block disabled is accepted and attaches nothing
    engine, *_ = zerotrain.initialize(model=tiny_gpt(), config=gpt_config(**{name: {**block[name], "enabled": False}}))
    assert engine.features == []


def test_model_without_trainable_parameters():
    model = mlp()
    model.requires_grad_(False)
    with pytest.raises(ConfigError, match="trainable"):
        zerotrain.initialize(model=model, config=config())


def test_foreign_tensor_in_model_parameters():
    model = mlp()
    foreign = nn.Parameter(torch.zeros(3))
    with pytest.raises(ConfigError, match="not a parameter of the model"):
        zerotrain.initialize(model=model, model_parameters=[*model.parameters(), foreign], config=config())


def test_step_without_an_optimizer():
    engine, optimizer, _, _ = zerotrain.initialize(model=mlp(), config=no_optimizer_config())
    assert optimizer is None and engine.get_lr() == []
    x, y = micro_batch(0)
    engine.backward(mse(engine, x, y))
    with pytest.raises(RuntimeError, match="optimizer"):
        engine.step()

