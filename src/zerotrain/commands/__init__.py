"""Subcommands of the `zerotrain` CLI (see cli.py's COMMANDS table): each module provides
`add_arguments(parser)` and `run(args) -> int`."""
