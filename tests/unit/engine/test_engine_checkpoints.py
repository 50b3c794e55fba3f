"""The engine in one process: save, resume and load options."""

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


def test_checkpoint_resume_gives_identical_losses(tmp_path):
    engine, *_ = zerotrain.initialize(model=tiny_gpt(), config=gpt_config())
    losses, lrs = train_gpt(engine, 6, save_dir=tmp_path, save_at=3)
    final = snapshot(engine.module)

    resumed, *_ = zerotrain.initialize(model=tiny_gpt(seed=1), config=gpt_config())
    path, client_state = resumed.load_checkpoint(tmp_path)
    assert path == str(tmp_path / "global_step3")
    assert client_state["epoch"] == 7 and torch.equal(client_state["seen"], torch.arange(3))
    assert (resumed.global_steps, resumed.global_samples, resumed.micro_steps) == (3, 6, 3)
    more, more_lrs = train_gpt(resumed, 6)
    assert more == losses[3:]  # bit-identical continuation
    assert more_lrs == lrs[3:]
    assert same(snapshot(resumed.module), final)


def test_checkpoint_folder_layout(tmp_path):
    engine, *_ = zerotrain.initialize(model=tiny_gpt(), config=gpt_config())
    train_gpt(engine, 2)
    engine.save_checkpoint(tmp_path)
    assert (tmp_path / "latest").read_text().strip() == "global_step2"
    files = {p.name for p in (tmp_path / "global_step2").iterdir()}
    assert {"model_states.pt", "manifest.json"} <= files
    manifest = json.loads((tmp_path / "global_step2" / "manifest.json").read_text())
    assert "model_states.pt" in manifest["files"]
    engine.save_checkpoint(tmp_path, tag="mine", save_latest=False)
    assert (tmp_path / "mine" / "model_states.pt").is_file()
    assert (tmp_path / "latest").read_text().strip() == "global_step2"


@pytest.mark.parametrize("tag", ["../x", "a/b", "..", "latest"])
def test_checkpoint_tag_must_be_a_plain_name(tmp_path, tag):
    engine, *_ = zerotrain.initialize(model=mlp(), config=config())
    with pytest.raises(ConfigError, match="tag"):
        engine.save_checkpoint(tmp_path / "ckpt", tag=tag)
    assert not (tmp_path / "x").exists()


def test_load_from_an_empty_dir_returns_none(tmp_path):
    engine, *_ = zerotrain.initialize(model=mlp(), config=config())
    before = snapshot(engine.module)
    assert engine.load_checkpoint(tmp_path) == (None, None)
    assert same(snapshot(engine.module), before)


def test_load_without_optimizer_or_scheduler_states(tmp_path):
    engine, optimizer, _, scheduler = zerotrain.initialize(model=tiny_gpt(), config=gpt_config())
    train_gpt(engine, 3)
    engine.save_checkpoint(tmp_path)
    saved_module, saved_optim = snapshot(engine.module), optimizer_state(optimizer)
    saved_sched = dict(scheduler.state_dict())

    # a second engine with its own (different) history
    other, other_opt, _, other_sched = zerotrain.initialize(model=tiny_gpt(seed=1), config=gpt_config())
    train_gpt(other, 1)
    own_optim, own_sched, own_lr = optimizer_state(other_opt), dict(other_sched.state_dict()), other.get_lr()
    assert not states_equal(own_optim, saved_optim) and own_sched != saved_sched

    other.load_checkpoint(tmp_path, load_optimizer_states=False, load_lr_scheduler_states=False)
    assert same(snapshot(other.module), saved_module)  # the weights always load
    assert states_equal(optimizer_state(other_opt), own_optim)
    assert other_sched.state_dict() == own_sched and other.get_lr() == own_lr
    assert other.global_steps == 3

    other.load_checkpoint(tmp_path, load_optimizer_states=True, load_lr_scheduler_states=False)
    assert states_equal(optimizer_state(other_opt), saved_optim)
    assert other_sched.state_dict() == own_sched

    other.load_checkpoint(tmp_path)
    assert other_sched.state_dict() == saved_sched


def test_fp16_checkpoint_restores_the_loss_scale_and_masters(tmp_path):
    cfg = gpt_config(fp16={"enabled": True, "initial_scale_power": 8, "loss_scale_window": 1})
    engine, *_ = zerotrain.initialize(model=tiny_gpt(), config=cfg)
    losses, _ = train_gpt(engine, 6, save_dir=tmp_path, save_at=3)
    assert engine.skipped_steps == 0

    resumed, *_ = zerotrain.initialize(model=tiny_gpt(seed=1), config=cfg)
    assert resumed.loss_scale == 256
    resumed.load_checkpoint(tmp_path)
    assert resumed.loss_scale == 1024  # 256 -> 256 -> 512 -> 1024 over the first three steps
    more, _ = train_gpt(resumed, 6)
    assert more == losses[3:]
    assert resumed.loss_scale == engine.loss_scale


def test_load_falls_back_to_the_newest_complete_checkpoint_when_asked(tmp_path):
    from zerotrain.errors import CheckpointError

    engine, *_ = zerotrain.initialize(model=mlp(), config=config())
    for step in range(2):
        x, y = micro_batch(step)
        engine.backward(mse(engine, x, y))
        engine.step()
        engine.save_checkpoint(tmp_path)  # global_step1, then global_step2 (latest)
    damaged = tmp_path / "global_step2" / "model_states.pt"
    damaged.write_bytes(damaged.read_bytes()[:-7])  # truncated
    fresh, *_ = zerotrain.initialize(model=mlp(1), config=config())
    with pytest.raises(CheckpointError, match="model_states.pt"):
        fresh.load_checkpoint(tmp_path)
    path, _ = fresh.load_checkpoint(tmp_path, fallback_to_complete=True)
    assert path.endswith("global_step1") and fresh.global_steps == 1
    # latest unreadable, latest gone (a save killed before its first latest): the same fallback
    (tmp_path / "latest").write_bytes(b"\xff")
    with pytest.raises(CheckpointError, match="latest is corrupted"):
        fresh.load_checkpoint(tmp_path)
    assert fresh.load_checkpoint(tmp_path, fallback_to_complete=True)[0].endswith("global_step1")
    (tmp_path / "latest").unlink()
    assert fresh.load_checkpoint(tmp_path) == (None, None)
    assert fresh.load_checkpoint(tmp_path, fallback_to_complete=True)[0].endswith("global_step1")


def test_stage3_weights_load_with_load_module_only(tmp_path):
    """Stage 3 keeps its weights with the per-rank shards, not in the module state."""
    cfg = config(zero_optimization={"stage": 3, "stage3_param_persistence_threshold": 0})
    engine, *_ = zerotrain.initialize(model=mlp(), config=cfg)
    train_engine(engine, 3, 1)
    engine.save_checkpoint(tmp_path)
    fresh, *_ = zerotrain.initialize(model=mlp(seed=1), config=cfg)
    fresh.load_checkpoint(tmp_path, load_module_only=True)
    assert same(fresh.module_state_dict(), engine.module_state_dict())
    assert fresh.global_steps == 0  # only the module

