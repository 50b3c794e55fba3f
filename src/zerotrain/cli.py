"""The `zerotrain` command: one function per subcommand, listed in COMMANDS."""

from __future__ import annotations

import argparse
import sys

from .errors import CheckpointError, ConfigError, DataError


def _demo(args: argparse.Namespace) -> int:
    from .demo import launch

    return launch(args.nproc_per_node, args.steps)


COMMANDS = {
    "demo": (_demo, "train a small GPT on the Python standard library with 2 processes (no download)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zerotrain", description="ZeRO training engine for language models")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help=COMMANDS["demo"][1])
    demo.add_argument("--nproc_per_node", type=int, default=2, help="processes to launch (default 2)")
    demo.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command][0](args)
    except (ConfigError, DataError, CheckpointError) as e:
        print(f"zerotrain: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
