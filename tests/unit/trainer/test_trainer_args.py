"""Options: names and defaults as HF's, an options file under the command line, one-line errors."""

from __future__ import annotations

import argparse

import pytest

from zerotrain.cli import build_parser
from zerotrain.commands.train import collect
from zerotrain.errors import ConfigError
from zerotrain.trainer.args import TrainingArguments, build


def parse(argv: list[str]):
    args = build_parser().parse_args(["train", *argv])
    values, _ = collect(args)
    explicit: set[str] = set()
    return (*build(values, explicit), explicit, args)


def test_options_file_then_command_line(tmp_path):
    (tmp_path / "run.yaml").write_text("output_dir: out\nlearning_rate: 0.001\nfp16: true\n"
                                       "evaluation_strategy: steps\nnproc_per_node: 2\n"
                                       "deepspeed: {zero_optimization: {stage: 2}}\n", encoding="utf-8")
    model, data, train, explicit, args = parse([str(tmp_path / "run.yaml"), "--learning_rate", "3e-4",
                                                "--fp16", "false", "--eval_strategy", "epoch"])
    assert train.learning_rate == 3e-4 and train.fp16 is False
    assert train.eval_strategy == "epoch"  # the CLI spelling beats the file's alias
    assert train.deepspeed == {"zero_optimization": {"stage": 2}}
    assert args.nproc_per_node == 2
    assert {"learning_rate", "fp16", "eval_strategy", "output_dir", "deepspeed"} <= explicit
    assert "seed" not in explicit and train.seed == 42


def test_bare_flag_means_true_and_alias_is_accepted():
    _, _, train, _, _ = parse(["--output_dir", "o", "--bf16", "--evaluation_strategy", "steps",
                               "--eval_steps", "7", "--group_by_length"])
    assert train.bf16 and train.group_by_length and train.eval_strategy == "steps" and train.eval_steps == 7


def test_eval_steps_defaults_to_logging_steps():
    assert TrainingArguments(output_dir="o", logging_steps=3).eval_steps == 3


@pytest.mark.parametrize("values, message", [
    ({"output_dir": "o", "learning_rat": 1}, "unknown option, did you mean learning_rate?"),
    ({"output_dir": "o", "fp16": True, "bf16": True}, "fp16 and bf16 are both set"),
    ({"output_dir": "o", "per_device_train_batch_size": 0}, "per_device_train_batch_size: should be a positive"),
    ({"output_dir": "o", "max_steps": "many"}, "max_steps: cannot read 'many' as int"),
    ({"output_dir": "o", "optim": "adamax"}, "optim: should be one of adamw, adam, sgd, momentum"),
    ({"output_dir": "o", "lr_scheduler_type": "reduce_lr_on_plateau"}, "set eval_strategy to steps or epoch"),
    ({"output_dir": "o", "eval_strategy": "steps", "evaluation_strategy": "no"}, "set the same option"),
    ({}, "output_dir is required"),
])
def test_bad_options_are_one_line_errors(values, message):
    with pytest.raises(ConfigError) as err:
        build(values)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_field_docs_are_the_cli_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["train"]
    text = sub.format_help()
    for phrase in ("--per_device_train_batch_size", "Micro-batches summed into each optimizer step",
                   "--evaluation_strategy", "Batch samples of similar length together", "--lora_target_modules"):
        assert phrase in text


def test_trainer_is_reachable_from_the_package():
    import zerotrain
    from zerotrain.trainer import Trainer

    assert zerotrain.Trainer is Trainer and zerotrain.TrainingArguments is TrainingArguments
