"""Stage 3 gathers a module again for backward from a hook on its outputs' gradients: outputs
of every shape must still find their parameters whole when autograd needs them (one
process: the same gather / release schedule as N ranks, without the collectives)."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
from torch import nn

import zerotrain
from zerotrain.zero.stage3 import gather as stage3_gather
from zerotrain.zero.stage3.pages import MovedPages, OwnStorages


@dataclasses.dataclass
class Box:  # an output type the pytree utilities cannot look into
    value: torch.Tensor


class OwnsAndBoxes(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 16) * 0.1)

    def forward(self, x):
        return Box(x @ self.weight)


class TwoOutputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 16) * 0.1)

    def forward(self, x):
        y = x @ self.weight
        return y.tanh(), y.sigmoid()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.boxed = OwnsAndBoxes()
        self.two = TwoOutputs()
        self.first = nn.Linear(16, 16)
        self.last = nn.Linear(16, 1)

    def forward(self, x, labels=None):
        h = self.first(x)
        h.mul_(2.0)  # in place on a module output, after its forward hook ran
        h = self.boxed(h).value
        a, b = self.two(h)
        return ((self.last(a * b) - labels) ** 2).mean()


def stage3_engine(**zero):
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
           "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, **zero}}
    engine, *_ = zerotrain.initialize(model=Net(), config=cfg)
    return engine


def batches(n: int):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 16, generator=g), torch.randn(4, 1, generator=g)) for _ in range(n)]


@pytest.mark.parametrize("memory", ["default", "own_storages"])
def test_outputs_of_any_shape_get_their_parameters_back_for_backward(memory, monkeypatch):
    if memory == "own_storages":  # what accelerators and other systems get (pages.py)
        monkeypatch.setattr(stage3_gather, "whole_buffers", lambda numels, dtype, device: OwnStorages(numels, dtype, device))
    reference = Net()
    opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.01)
    expected = []
    for x, y in batches(4):
        loss = reference(x, labels=y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        expected.append(loss.item())

    engine = stage3_engine()
    moved = memory == "default" and sys.platform.startswith("linux")
    assert type(engine.strategy.gatherer.memory) is (MovedPages if moved else OwnStorages)
    got = []
    for x, y in batches(4):
        loss = engine(x, labels=y)
        engine.backward(loss)
        engine.step()
        got.append(loss.item())
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-5, atol=1e-6)
    full = engine.strategy.full_state_dict(engine.module)
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(full[name], value, rtol=1e-5, atol=1e-6)


def gathers_per_step(reuse: int | None) -> tuple[list[float], int]:
    engine = stage3_engine(**({} if reuse is None else {"stage3_max_reuse_distance": reuse}))
    gatherer = engine.strategy.gatherer
    calls = []
    start = gatherer.start
    def counted(own):
        pending = start(own)
        calls.append(len(pending.runs))  # collectives launched (one per contiguous run)
        return pending

    gatherer.start = counted
    losses = []
    for step, (x, y) in enumerate(batches(4)):
        if step == 3:
            calls.clear()  # the traces of earlier passes exist from the second step on
        loss = engine(x, labels=y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses, sum(calls)


def test_max_reuse_distance_keeps_what_backward_needs_next():
    released, fetched_back = gathers_per_step(0)
    kept, fewer = gathers_per_step(10**9)  # everything's next use is within reach
    default, some = gathers_per_step(None)
    assert released == kept == default  # only when params are gathered changes
    # forward gathers 4 modules. Backward runs last, two, first (boxed is never released: its
    # output is opaque); last is needed again at once, with nothing gathered in between.
    assert fetched_back == 4 + 2
    assert fewer == 4
    # by default the reuse distance is the prefetch window (2 x 256 elements here): two comes
    # back 17 + 17 elements later, first 529 + 273 later
    assert some == 4 + 1


def test_without_grad_every_module_is_released_after_its_forward():
    engine = stage3_engine()
    x, y = batches(1)[0]
    with torch.no_grad():
        engine(x, labels=y)
    assert engine.strategy.gatherer.live_numel == 0  # the opaque output's module too


def test_memory_breakdown_counts_whole_parameters_by_their_own_bytes():
    engine = stage3_engine()
    params = list(engine.module.parameters())
    shards = engine.memory_breakdown()["params"]["device"]
    with zerotrain.zero.GatheredParameters(params):
        whole = sum(p.numel() * p.element_size() for p in params)
        # not the size of the mapping they share (each slot is a page here)
        assert engine.memory_breakdown()["params"]["device"] == shards + whole
