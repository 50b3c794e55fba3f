"""The engine in one process: progress lines."""

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


def test_steps_per_print(zerotrain_log):
    model = mlp()
    engine, *_ = zerotrain.initialize(model=model, config=config(ga=2, steps_per_print=2))
    zerotrain_log.clear()
    losses = train_engine(engine, 5, 2)
    lines = progress_lines(zerotrain_log)
    assert [int(re.match(r"step=(\d+)", ln).group(1)) for ln in lines] == [2, 4]
    pattern = r"step=\d+ loss=([0-9.]+) lr=([0-9.e+-]+) samples/s=[0-9.]+"
    for ln, window in zip(lines, (losses[0:2], losses[2:4])):
        found = re.search(pattern, ln)
        assert found, ln
        assert float(found.group(1)) == pytest.approx(sum(window) / 2, abs=1e-4)
        assert float(found.group(2)) == pytest.approx(1e-2)
        assert "forward=" not in ln


def test_wall_clock_breakdown_adds_timings(zerotrain_log):
    model = mlp()
    engine, *_ = zerotrain.initialize(model=model, config=config(steps_per_print=2, wall_clock_breakdown=True))
    zerotrain_log.clear()
    train_engine(engine, 2, 1)
    lines = progress_lines(zerotrain_log)
    assert len(lines) == 1
    assert re.search(r"forward=[0-9.]+ms backward=[0-9.]+ms step=[0-9.]+ms", lines[0]), lines[0]


def test_no_progress_lines_without_steps_per_print(zerotrain_log):
    model = mlp()
    engine, *_ = zerotrain.initialize(model=model, config=config())
    zerotrain_log.clear()
    train_engine(engine, 4, 1)
    assert progress_lines(zerotrain_log) == []



def test_backward_leaves_the_loss_on_its_device(zerotrain_log, monkeypatch):
    """A micro-step reads nothing back to the host (on a GPU that read would wait for the
    device every backward); the window's summed loss is read only by the progress line."""
    engine, *_ = zerotrain.initialize(model=mlp(), config=config(ga=2, steps_per_print=1))
    zerotrain_log.clear()
    reads = []
    for name in ("item", "cpu", "tolist", "__float__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _n=name, _o=original, **k: (reads.append(_n), _o(self, *a, **k))[1])
    losses = []
    for m in range(2):
        x, y = micro_batch(m)
        loss = mse(engine, x, y)
        reads.clear()
        engine.backward(loss)
        losses.append(loss.detach())
        assert reads == [], f"micro-step {m}: backward read {reads} to the host"
        assert engine._window_loss.dtype == torch.float64 and engine._window_loss.device == loss.device
        if m == 0:
            reads.clear()
            engine.step()  # not a boundary: nothing to read either
            assert reads == [], f"a micro-step that is no boundary read {reads} to the host"
    monkeypatch.undo()
    engine.step()  # the boundary: the progress line reads the window once
    assert float(engine._window_loss) == 0.0  # read and reset by the progress line
    found = re.search(r"loss=([0-9.]+)", progress_lines(zerotrain_log)[-1])
    assert float(found.group(1)) == pytest.approx(float(sum(losses)) / 2, abs=1e-4)
