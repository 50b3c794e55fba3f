"""add_config_arguments, logger / log_dist, set_random_seed, see_memory_usage, outside a world."""

import argparse
import logging
import random

import numpy as np
import pytest
import torch

import zerotrain
from zerotrain.runtime.utils import see_memory_usage, set_random_seed
from zerotrain.utils import RepeatingLoader, log_dist, logger


def test_add_config_arguments_adds_deepspeeds_options():
    parser = zerotrain.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--deepspeed", "--deepspeed_config", "ds.json"])
    assert args.deepspeed is True and args.deepspeed_config == "ds.json"
    assert args.deepscale is False and args.deepscale_config is None
    plain = parser.parse_args([])
    assert plain.deepspeed is False and plain.deepspeed_config is None


def test_log_dist_logs_without_a_world_and_logger_is_zerotraines(caplog):
    assert logger.name.startswith("zerotrain.")
    logger.addHandler(caplog.handler)
    try:
        log_dist("hello", ranks=[0])
        log_dist("quiet", ranks=[1], level=logging.WARNING)
    finally:
        logger.removeHandler(caplog.handler)
    got = {r.getMessage(): r.levelno for r in caplog.records}  # caplog may also see them through the root
    assert got == {"[Rank -1] hello": logging.INFO, "[Rank -1] quiet": logging.WARNING}


def test_set_random_seed_seeds_python_numpy_and_torch():
    def draw():
        return random.random(), float(np.random.rand()), float(torch.rand(1))

    set_random_seed(11)
    first = draw()
    set_random_seed(11)
    assert draw() == first
    set_random_seed(12)
    assert draw() != first


def test_see_memory_usage_only_when_forced():
    assert see_memory_usage("quiet") is None
    line = see_memory_usage("after load", force=True)
    assert line.startswith("after load | MA ") and "Max_CA" in line and "CPU used" in line


def test_repeating_loader_starts_over():
    loader = RepeatingLoader([1, 2])
    assert [next(loader) for _ in range(5)] == [1, 2, 1, 2, 1]


@pytest.mark.parametrize("name", ["init_distributed", "add_config_arguments", "get_accelerator",
                                  "DeepSpeedEngine", "DeepSpeedConfig", "__git_hash__", "__git_branch__"])
def test_the_top_level_has_deepspeeds_names(name):
    assert getattr(zerotrain, name)


def test_git_hash_is_this_checkout():
    import subprocess
    from pathlib import Path

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(zerotrain.__file__).parent,
                          capture_output=True, text=True).stdout.strip()
    assert zerotrain.__git_hash__ == (head or "unknown")
