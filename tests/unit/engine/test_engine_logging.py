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

