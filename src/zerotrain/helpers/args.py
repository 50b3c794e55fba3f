"""The command-line options DeepSpeed scripts add to their parser."""

from __future__ import annotations

import argparse


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add a "DeepSpeed" group: `--deepspeed` (a switch), `--deepspeed_config PATH` (what
    initialize(args=args) reads), and their deprecated spellings `--deepscale` and
    `--deepscale_config`. Returns the parser."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configuration (read by zerotrain.initialize)")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="train with the engine (kept for scripts that test the flag)")
    group.add_argument("--deepspeed_config", default=None, type=str, help="DeepSpeed JSON config file")
    group.add_argument("--deepscale", default=False, action="store_true", help=argparse.SUPPRESS)
    group.add_argument("--deepscale_config", default=None, type=str, help=argparse.SUPPRESS)
    return parser
