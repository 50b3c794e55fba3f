"""One batch arithmetic: DeepSpeed's triad rules give the same numbers through every door,
zerotrain.initialize (load_config at its data-parallel world size), `zerotrain config
--world_size N`, and the trainer's plan (preflight, as `zerotrain train` runs it before any
rank starts); and the problems of one config file come in one message."""

from __future__ import annotations

import json
import re

import pytest
import torch

import zerotrain
from zerotrain.cli import main
from zerotrain.commands.config import resolve
from zerotrain.config import load_config
from zerotrain.errors import ConfigError
from zerotrain.trainer.plan import Options
from zerotrain.trainer.preflight import preflight

KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
# (train, micro, accumulation) given -> {world size: (train, micro, accumulation) or the error}
TABLE = [
    ((16, None, 1), {1: (16, 16, 1), 2: (16, 8, 1), 4: (16, 4, 1)}),  # Megatron's shape
    ((16, None, None), {1: (16, 16, 1), 2: (16, 8, 1), 4: (16, 4, 1)}),
    ((16, 4, None), {1: (16, 4, 4), 2: (16, 4, 2), 4: (16, 4, 1)}),
    ((16, None, 2), {1: (16, 8, 2), 2: (16, 4, 2), 4: (16, 2, 2)}),
    ((None, 4, 2), {1: (8, 4, 2), 2: (16, 4, 2), 4: (32, 4, 2)}),
    ((None, 4, None), {1: (4, 4, 1), 2: (8, 4, 1), 4: (16, 4, 1)}),
    ((16, 2, 2), {1: "batch sizes disagree", 2: "batch sizes disagree", 4: (16, 2, 2)}),
    ((2, None, None), {1: (2, 2, 1), 2: (2, 1, 1), 4: "works out to 0"}),
]
CASES = [(given, world, want) for given, worlds in TABLE for world, want in worlds.items()]


def file_of(tmp_path, given, **extra) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({**{k: v for k, v in zip(KEYS, given) if v is not None}, **extra}), encoding="utf-8")
    return str(path)


def through_initialize(path, world):
    if world == 1:  # the whole door in one process
        engine, *_ = zerotrain.initialize(model=torch.nn.Linear(2, 2), config=path)
        return engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    cfg = load_config(path, world_size=world)  # what initialize calls with its data-parallel world size
    return tuple(getattr(cfg, k) for k in KEYS)


def through_config_command(path, world):
    table, _, _ = resolve(path, world)
    values = {key: value for key, value, _ in table}
    return tuple(int(values[k]) for k in KEYS)


def through_trainer(tmp_path, path, world, **options):
    train = tmp_path / "train.txt"
    train.write_text("the quick brown fox\n", encoding="utf-8")
    values = {"model_config": "gpt-tiny", "train_file": str(train), "output_dir": str(tmp_path / f"out{world}"),
              "deepspeed": path,
              "max_steps": 1, "report_to": "none", **options}
    plan = preflight(Options.parse(values), world)
    got = tuple(getattr(plan.config, k) for k in KEYS)
    assert (plan.options.per_device_train_batch_size, plan.options.gradient_accumulation_steps) == got[1:]
    return got


@pytest.mark.parametrize("given,world,want", CASES, ids=[f"{g}-w{w}" for g, w, _ in CASES])
def test_the_triad_is_deepspeeds_through_every_door(tmp_path, given, world, want):
    path = file_of(tmp_path, given)
    for door in (lambda: through_initialize(path, world), lambda: through_config_command(path, world),
                 lambda: through_trainer(tmp_path, path, world)):
        if isinstance(want, str):
            with pytest.raises(ConfigError, match=want):
                door()
        else:
            assert door() == want


def test_the_trainer_fills_the_hf_default_only_where_the_file_says_nothing(tmp_path):
    # neither train_batch_size nor the micro batch in the file: per_device_train_batch_size's default, 8
    assert through_trainer(tmp_path, file_of(tmp_path, (None, None, 2)), 2) == (32, 8, 2)
    # an option the user set is a given like the file's numbers
    path = file_of(tmp_path, (16, None, None))
    assert through_trainer(tmp_path, path, 2, per_device_train_batch_size=2) == (16, 2, 4)
    assert through_trainer(tmp_path, path, 1, gradient_accumulation_steps=4) == (16, 4, 4)


def test_the_megatron_shape_at_the_command_line(tmp_path, capsys):
    path = file_of(tmp_path, (16, None, 1))
    for world, micro in ((1, 16), (4, 4)):
        assert main(["config", path, "--world_size", str(world)]) == 0
        assert re.search(rf"\n  train_micro_batch_size_per_gpu +{micro} +derived", capsys.readouterr().out)


def test_every_problem_of_a_file_in_one_message(tmp_path):
    path = file_of(tmp_path, (16, None, 1), zero_optimization={"stagee": 1, "overlap_com": True},
                   gradient_clipping="lots")
    want = ["zero_optimization.stagee: unknown key, did you mean stage?",
            "zero_optimization.overlap_com: unknown key, did you mean overlap_comm?",
            'gradient_clipping: should be a number, got "lots"']
    with pytest.raises(ConfigError) as err:
        load_config(path, world_size=3)  # initialize's door; 16 is no multiple of 3
    assert str(err.value).splitlines() == ["4 problems in the DeepSpeed config:", *(f"  {w}" for w in want),
                                           "  batch sizes disagree: train_batch_size 16 != train_micro_batch_size_per_gpu"
                                           " 5 x gradient_accumulation_steps 1 x world size 3 = 15"]
    with pytest.raises(ConfigError) as err:  # the trainer's door: an option the user set against the file
        through_trainer(tmp_path, path, 1, per_device_train_batch_size=8)
    lines = str(err.value).splitlines()
    assert lines[0] == "4 problems in the DeepSpeed config:"
    assert lines[1].startswith("  the DeepSpeed config disagrees with the options: train_batch_size=16 vs "
                               "per_device_train_batch_size 8 x gradient_accumulation_steps 1 x 1 processes = 8")
    assert lines[2:] == [f"  {w}" for w in want]
