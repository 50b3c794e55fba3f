"""The `zerotrain` command. Each subcommand lives in its own module, which provides
`add_arguments(parser)` and `run(args) -> int`; this table is the whole dispatcher."""

from __future__ import annotations

import argparse
import importlib
import sys

from .errors import CheckpointError, ConfigError, DataError, NonFiniteStepsError

# name -> (module implementing it, one-line help)
COMMANDS = {
    "demo": ("zerotrain.demo", "train a small GPT on the Python standard library with 2 processes (no download)"),
    "train": ("zerotrain.commands.train", "train a causal LM, masked LM or classifier with HF TrainingArguments options"),
    "analyze": ("zerotrain.commands.analyze", "each training sample's difficulty (sequence length, vocabulary rarity) "
                                              "as the index files of the curriculum by any metric"),
    "plot": ("zerotrain.commands.plot", "draw a run's loss, eval loss, LR, seqlen and theta to a PNG"),
    "merge-lora": ("zerotrain.commands.merge_lora", "fold a LoRA adapter into its base model's weights"),
    "config": ("zerotrain.commands.config", "each key of a DeepSpeed config: the value in force and where it came from"),
    "estimate": ("zerotrain.commands.estimate", "model-state memory per rank for each ZeRO stage and offload choice"),
    "launch": ("zerotrain.commands.launch", "start a script on N ranks with the `deepspeed` launcher's options"),
    "consolidate": ("zerotrain.commands.consolidate", "write full fp32 weights (safetensors) from a checkpoint of any stage"),
    "convert": ("zerotrain.commands.convert", "write a checkpoint as a DeepSpeed universal checkpoint (--to deepspeed-universal)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zerotrain", description="ZeRO training engine for language models")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(sub_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    foreign = {}
    if argv and argv[0] in COMMANDS:  # a command may take options it does not define (commands/train.py)
        split = getattr(importlib.import_module(COMMANDS[argv[0]][0]), "split_foreign", None)
        if split is not None:
            rest, foreign = split(argv[1:])
            argv = [argv[0], *rest]
    args = build_parser().parse_args(argv)
    args.foreign = foreign
    try:
        return importlib.import_module(COMMANDS[args.command][0]).run(args)
    except (ConfigError, DataError, CheckpointError, NonFiniteStepsError) as e:
        print(f"zerotrain: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
