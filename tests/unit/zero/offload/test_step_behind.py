"""With the masters in NVMe, stage 3's optimizer step runs behind the next forward: the
trained values, the losses and the optimizer state are bit-identical to the step run in
place, however slow the step's disk is (each read below sleeps), with clipping and an LR
schedule that changes the learning rate while the step still runs."""

from __future__ import annotations

import time

import pytest
import torch
from test_nvme_buffers import WIDTH, Stack  # the same six tanh layers

import zerotrain
from zerotrain.zero.offload import blockwise_optimizer
from zerotrain.zero.offload.nvme_swap import FileStore


def train(folder, behind: bool, steps: int = 3, frozen: bool = False):
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0, "sub_group_size": 100,
            "offload_param": {"device": "nvme", "nvme_path": str(folder)},
            "offload_optimizer": {"device": "nvme", "nvme_path": str(folder)}}
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0.05, "zero_optimization": zero,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-2,
                                                        "warmup_num_steps": 4}}}
    model = Stack()
    if frozen:  # a group of its own at stage 3, gathered but never stepped
        model.layers[1].requires_grad_(False)
    engine, *_ = zerotrain.initialize(model=model, config=cfg)
    stepper = engine.strategy.stepper
    assert stepper.runs_behind
    stepper.runs_behind = behind
    g = torch.Generator().manual_seed(1)
    losses, running = [], []
    for _ in range(steps):
        x, y = torch.randn(4, WIDTH, generator=g), torch.randn(4, WIDTH, generator=g)
        loss = engine(x, labels=y)
        engine.backward(loss)
        engine.step()
        running.append(engine.strategy.behind.running)
        losses.append(loss.item())
    weights = engine.module_state_dict()
    state = {gi: {k: whole(v) for k, v in entry.items()} for gi, entry in stepper.state_dict()["state"].items()}
    state["masters"] = {gi: stepper.master(gi) for gi in range(len(stepper.groups))}
    engine.destroy()
    return losses, weights, state, running


def whole(value):
    if isinstance(value, FileStore):
        out = torch.empty(value.numel, dtype=value.dtype)
        value.read_into(0, out)
        return out
    return value.clone()


@pytest.fixture
def slow_disk(monkeypatch):
    """Every read of the step's blocks takes a millisecond: the forward catches the step up."""
    read = blockwise_optimizer._read_rows

    def slow(*args):
        time.sleep(1e-3)
        read(*args)

    monkeypatch.setattr(blockwise_optimizer, "_read_rows", slow)


@pytest.mark.parametrize("frozen", [False, True])
def test_the_step_behind_the_forward_equals_the_step_in_place(tmp_path, slow_disk, frozen):
    in_place = train(tmp_path, behind=False, frozen=frozen)
    behind = train(tmp_path, behind=True, frozen=frozen)
    assert in_place[3] == [False] * 3 and behind[3] == [True] * 3  # engine.step() returned before its step ended
    assert behind[0] == in_place[0]
    assert behind[1].keys() == in_place[1].keys()
    for name, value in in_place[1].items():
        assert torch.equal(behind[1][name], value), name
    for gi, entry in in_place[2].items():
        for key, value in entry.items():
            assert torch.equal(behind[2][gi][key], value), (gi, key)
    assert list(tmp_path.iterdir()) == []  # destroy joined the step and removed the swap files


def test_an_error_of_the_step_is_raised_by_the_next_forward(tmp_path, monkeypatch):
    def broken(*args):
        raise OSError("the disk went away")

    engine, *_ = zerotrain.initialize(model=Stack(), config={
        "train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "Adam", "params": {"lr": 1e-2}},
        "zero_optimization": {"stage": 3, "sub_group_size": 100,
                              "offload_param": {"device": "nvme", "nvme_path": str(tmp_path)},
                              "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path)}}})
    x = torch.randn(4, WIDTH)
    engine.backward(engine(x, labels=x))
    monkeypatch.setattr(blockwise_optimizer, "_read_rows", broken)
    engine.step()  # the step's first read fails on its thread
    with pytest.raises(OSError, match="the disk went away"):
        engine(x, labels=x)
    monkeypatch.undo()
    engine.destroy()
