"""`zerotrain train [OPTIONS_FILE] [--option value ...]`: train with HF TrainingArguments names.

    zerotrain train run.yaml --learning_rate 3e-4          options file, then the command line
    zerotrain train --nproc_per_node 2 ...                  launches 2 ranks through torchrun
    torchrun --nproc_per_node 2 -m zerotrain train ...      the same, launched by hand

With --nproc_per_node > 1 this process checks what it can (options, files, output_dir, the
DeepSpeed config) before starting any rank, then starts torchrun. A rank that stops on a user
error writes its message to a file the launcher reads, so the job ends with that one line
and exit code 2 instead of a traceback per rank.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from ..errors import CheckpointError, ConfigError, DataError, DistributedFaultError, NonFiniteStepsError
from ..trainer import args as targs

_ERROR_DIR = "ZEROTRAIN_ERROR_DIR"
_USER_ERRORS = (ConfigError, DataError, CheckpointError, NonFiniteStepsError, DistributedFaultError)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("options_file", nargs="?", help="YAML or JSON file of options (the command line overrides it)")
    parser.add_argument("--nproc_per_node", type=int, default=None,
                        help="processes to launch on this machine (default 1; torchrun's variables win)")
    for cls, title in ((targs.ModelArguments, "model"), (targs.DataArguments, "data"),
                       (targs.TrainingArguments, "training")):
        group = parser.add_argument_group(title)
        for name, f in targs.fields_of(cls).items():
            kind = targs._type_of(f)
            names = [f"--{name}"] + [f"--{a}" for a in f.metadata.get("aliases", ())]
            default = f.default if f.default is not None and not callable(f.default) else None
            help_text = f.metadata["help"] + (f" (default: {default})" if default not in (None, "") else "")
            extra = {"nargs": "?", "const": "true", "metavar": "BOOL"} if kind.startswith("bool") else {}
            if "choices" in f.metadata:
                extra["metavar"] = "{" + ",".join(f.metadata["choices"]) + "}"
            group.add_argument(*names, dest=name, default=argparse.SUPPRESS, help=help_text.replace("%", "%%"), **extra)


def collect(args: argparse.Namespace) -> tuple[dict, dict]:
    """(options file values overridden by the command line, the command-line values alone)."""
    values = targs.read_options_file(args.options_file) if args.options_file else {}
    cli = {k: v for k, v in vars(args).items() if k not in ("command", "options_file", "nproc_per_node")}
    aliases = targs.aliases()
    for key in list(values):  # a CLI value replaces the file's, whichever spelling either used
        if aliases.get(key, key) in cli:
            del values[key]
    if args.nproc_per_node is None and "nproc_per_node" in values:
        args.nproc_per_node = int(values["nproc_per_node"])
    values.pop("nproc_per_node", None)
    values.update(cli)
    return values, cli


def _precheck(model_args, data_args, train_args, explicit: set[str], nproc: int) -> None:
    """What can fail without a rank: fail here, before torchrun starts anything."""
    from ..config import load_config
    from ..trainer.loop.run_folder import check_output_dir
    from ..trainer.ds_config import build_deepspeed_config, fill_schedule

    check_output_dir(Path(train_args.output_dir).expanduser(), train_args.overwrite_output_dir,
                     bool(train_args.resume_from_checkpoint))
    for name in ("train_file", "validation_file"):
        value = getattr(data_args, name)
        if value and not Path(value).expanduser().exists():
            raise DataError(f"{name} {value}: does not exist")
    if not data_args.train_file:
        raise ConfigError("train_file is required: pass --train_file PATH")
    if model_args.model_name_or_path and model_args.model_config:
        raise ConfigError("model_name_or_path and model_config both given: start from a folder or from a "
                          "config, not both")
    # placeholder sizes: only the validity of the config is checked here
    ds, _ = build_deepspeed_config(_copy(train_args), explicit, nproc, 64, data_args.block_size or 64)
    ds = fill_schedule(ds, 1, 1)
    load_config(ds, world_size=nproc)


def _copy(train_args):
    import copy

    return copy.copy(train_args)


def _launch(argv: list[str], nproc: int) -> int:
    from ..comm.launch import run_ranks

    with tempfile.TemporaryDirectory(prefix="zerotrain-errors-") as errors:
        os.environ[_ERROR_DIR] = errors
        try:
            code, failed_rank = run_ranks("zerotrain", ["train", *argv], nproc, quiet=True)
        finally:
            del os.environ[_ERROR_DIR]
        messages = [p.read_text(encoding="utf-8").strip() for p in sorted(Path(errors).glob("rank*.txt"))]
    if messages:
        print(f"zerotrain: error: {messages[0]}", file=sys.stderr, flush=True)
        return 2
    if code != 0:
        where = f"rank {failed_rank} exited with code {code}" if failed_rank is not None else f"exit code {code}"
        print(f"zerotrain: training failed: {where}; see the rank output above", file=sys.stderr, flush=True)
    return code


def run(args: argparse.Namespace, callbacks=()) -> int:
    values, cli = collect(args)
    explicit: set[str] = set()
    model_args, data_args, train_args = targs.build(values, explicit)
    in_torchrun = "WORLD_SIZE" in os.environ
    nproc = args.nproc_per_node or 1
    if nproc > 1 and not in_torchrun:
        _precheck(model_args, data_args, train_args, explicit, nproc)
        argv = ([args.options_file] if args.options_file else []) + \
            [item for k, v in cli.items() for item in (f"--{k}", str(v))]
        return _launch(argv, nproc)
    if os.environ.get(_ERROR_DIR):  # a rank of our own launcher: go down with it
        from ..comm.launch import die_with_launcher

        die_with_launcher()
    from ..comm import shutdown
    from ..trainer.pipeline import run as run_pipeline

    try:
        run_pipeline(model_args, data_args, train_args, explicit, callbacks)
    except _USER_ERRORS as e:
        errors = os.environ.get(_ERROR_DIR)
        if not errors:
            raise
        Path(errors, f"rank{os.environ.get('RANK', '0')}.txt").write_text(str(e), encoding="utf-8")
        shutdown()
        return 2
    shutdown()  # a rank that exits with its gloo group alive can abort in C++ teardown
    return 0
