"""`zerotrain train [OPTIONS_FILE] [--option value ...]`: train with HF TrainingArguments names.

    zerotrain train run.yaml --learning_rate 3e-4          options file, then the command line
    zerotrain train --nproc_per_node 2 ...                  launches 2 ranks through torchrun
    torchrun --nproc_per_node 2 -m zerotrain train ...      the same, launched by hand
    zerotrain train --nnodes 2 --node_rank 0 --master_addr HOST --master_port 29500 ...
                                                            one node of two (run it on each node)

Before starting any rank, this process checks what it can (options, files, output_dir, the
DeepSpeed config: trainer/preflight.py), then starts torchrun with the launch options. A rank
that stops on a user error writes its message to a file the launcher reads, so the job ends
with that one line and exit code 2 instead of a traceback per rank; a run stopped by Ctrl-C or
SIGTERM ends with one line naming its checkpoint and exit code 130 or 143.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from ..errors import (CheckpointError, ConfigError, DataError, DistributedFaultError, NonFiniteStepsError,
                      TrainingInterrupted)
from ..trainer import args as targs
from ..trainer.hf_options import foreign_nargs, is_foreign

_ERROR_DIR = "ZEROTRAIN_ERROR_DIR"
_USER_ERRORS = (ConfigError, DataError, CheckpointError, NonFiniteStepsError, DistributedFaultError)
# torchrun's options, passed to it as given (nproc_per_node: processes on this machine)
LAUNCH_OPTIONS = {
    "nproc_per_node": (int, "processes to launch on this machine (default 1; torchrun's variables win)"),
    "nnodes": (str, "machines in the job, or MIN:MAX (torchrun); run the same command on each"),
    "node_rank": (int, "this machine's index among the nodes (static rendezvous)"),
    "master_addr": (str, "address of node 0, where the nodes meet (static rendezvous)"),
    "master_port": (int, "port on node 0 where the nodes meet (static rendezvous)"),
    "rdzv_backend": (str, "torchrun's rendezvous backend: static (default with master_addr) or c10d"),
    "rdzv_endpoint": (str, "HOST:PORT of the rendezvous (c10d)"),
    "rdzv_id": (str, "job id shared by the nodes (c10d)"),
    "max_restarts": (int, "times torchrun restarts the ranks after a failure (default 0)"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("options_file", nargs="?", help="YAML or JSON file of options (the command line overrides it)")
    launch = parser.add_argument_group("launch (torchrun)")
    for name, (kind, help_text) in LAUNCH_OPTIONS.items():
        launch.add_argument(f"--{name}", type=kind, default=None, help=help_text)
    for cls, title in ((targs.ModelArguments, "model"), (targs.DataArguments, "data"),
                       (targs.TrainingArguments, "training")):
        add_options(parser.add_argument_group(title), cls)


def add_options(group, cls, only: tuple[str, ...] | None = None) -> None:
    """One option per field of an options dataclass (its help, aliases and choices); values
    stay strings for targs.build, and options not given are absent from the namespace."""
    for name, f in targs.fields_of(cls).items():
        if only is not None and name not in only:
            continue
        kind = targs._type_of(f)
        names = [f"--{name}"] + [f"--{a}" for a in f.metadata.get("aliases", ())]
        default = f.default if f.default is not None and not callable(f.default) else None
        help_text = f.metadata["help"] + (f" (default: {default})" if default not in (None, "") else "")
        extra = {"nargs": "?", "const": "true", "metavar": "BOOL"} if kind.startswith("bool") else {}
        if "choices" in f.metadata:
            extra["metavar"] = "{" + ",".join(f.metadata["choices"]) + "}"
        group.add_argument(*names, dest=name, default=argparse.SUPPRESS, help=help_text.replace("%", "%%"), **extra)


def split_foreign(argv: list[str]) -> tuple[list[str], dict]:
    """Options this command does not define (HF / LLaMA-Factory names, typos) taken out before
    argparse sees them, so they get our one-line answer (hf_options.py, did-you-mean) and
    their values are not mistaken for the options file."""
    known = {"-h", "--help"} | {f"--{n}" for n in LAUNCH_OPTIONS} | {f"--{n}" for n in targs.aliases()} | \
        {f"--{name}" for cls in targs.ALL for name in targs.fields_of(cls)}
    keep, foreign, i = [], {}, 0
    while i < len(argv):
        item = argv[i]
        name = item.split("=", 1)[0]
        if item.startswith("--") and name not in known:
            if "=" in item:
                value = item.split("=", 1)[1]
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                count = foreign_nargs(name[2:])  # Megatron's --rampup-batch-size takes three
                taken = argv[i + 1 : i + 1 + count]
                taken = taken[: next((k for k, a in enumerate(taken) if a.startswith("--")), len(taken))]
                value, i = " ".join(taken), i + len(taken)
            else:
                value = "true"
            foreign[name[2:]] = value
        else:
            keep.append(item)
        i += 1
    return keep, foreign


def collect(args: argparse.Namespace) -> tuple[dict, dict]:
    """(options file values overridden by the command line, the command-line values alone)."""
    values = targs.read_options_file(args.options_file) if args.options_file else {}
    cli = {k: v for k, v in vars(args).items() if k not in ("command", "options_file", "foreign", *LAUNCH_OPTIONS)}
    cli.update(getattr(args, "foreign", None) or {})
    aliases = targs.aliases()
    for key in list(values):  # a CLI value replaces the file's, whichever spelling either used
        if aliases.get(key, key) in cli:
            del values[key]
    for name, (kind, _) in LAUNCH_OPTIONS.items():
        if getattr(args, name, None) is None and name in values:
            setattr(args, name, kind(values[name]))
        values.pop(name, None)
    values.update(cli)
    return values, cli


def _rendezvous(args) -> tuple[list[str], int]:
    """torchrun's options for a job over several machines ([] on one), and its largest node count."""
    given = {n: getattr(args, n, None) for n in LAUNCH_OPTIONS if n != "nproc_per_node"}
    given = {n: v for n, v in given.items() if v is not None}
    nnodes = str(given.get("nnodes", "1"))
    try:
        most = int(nnodes.split(":")[-1])
        if most < 1 or int(nnodes.split(":")[0]) < 1:
            raise ValueError
    except ValueError:
        raise ConfigError(f"nnodes: should be a count like 2, or MIN:MAX like 1:4, got {nnodes!r}") from None
    if most > 1 and "rdzv_endpoint" not in given and "master_addr" not in given:
        raise ConfigError(f"--nnodes {nnodes} needs a meeting point: --master_addr HOST --master_port PORT with "
                          "--node_rank N on each node, or --rdzv_backend c10d --rdzv_endpoint HOST:PORT")
    static = given.get("rdzv_backend", "static") == "static" and "rdzv_endpoint" not in given
    if most > 1 and static:
        if "node_rank" not in given:
            raise ConfigError(f"--nnodes {nnodes} with --master_addr needs --node_rank (0 to {most - 1}) on each node")
        if not 0 <= given["node_rank"] < most:
            raise ConfigError(f"node_rank: should be 0 to {most - 1} for --nnodes {nnodes}, got {given['node_rank']}")
    if set(given) <= {"max_restarts"} and most == 1:  # one machine: a rendezvous of its own
        return ["--standalone", f"--max_restarts={given['max_restarts']}"] if given else [], 1
    return [f"--{n}={v}" for n, v in given.items()], most


def _launch(argv: list[str], nproc: int, rendezvous: list[str] | None = None) -> int:
    from ..comm.launch import run_ranks

    with tempfile.TemporaryDirectory(prefix="zerotrain-errors-") as errors:
        os.environ[_ERROR_DIR] = errors
        try:
            code, failed_rank = run_ranks("zerotrain", ["train", *argv], nproc, quiet=True, rendezvous=rendezvous)
        finally:
            del os.environ[_ERROR_DIR]
        messages = [p.read_text(encoding="utf-8").strip() for p in sorted(Path(errors).glob("rank*.txt"))]
    if messages:
        print(f"zerotrain: error: {messages[0]}", file=sys.stderr, flush=True)
        return 2
    if code in (130, 143):  # interrupted: rank 0 has said where it stopped and how to resume
        return code
    if code != 0:
        where = f"rank {failed_rank} exited with code {code}" if failed_rank is not None else f"exit code {code}"
        print(f"zerotrain: training failed: {where}; see the rank output above", file=sys.stderr, flush=True)
    return code


def _notify(notices) -> None:
    for line in notices:
        print(f"zerotrain: notice: {line}", flush=True)


def run(args: argparse.Namespace, callbacks=()) -> int:
    from ..trainer.plan import Options
    from ..trainer.preflight import preflight

    values, cli = collect(args)
    options = Options.parse(values)
    in_torchrun = "WORLD_SIZE" in os.environ
    nproc = args.nproc_per_node or 1
    rendezvous, nodes = _rendezvous(args)
    if not in_torchrun and (nproc > 1 or nodes > 1 or rendezvous):
        _notify(options.notices)
        preflight(options, nproc * nodes)  # fail here, before any rank starts; each rank plans its own run
        if args.nnodes is not None:
            from ..comm.launch import NNODES_ENV

            os.environ[NNODES_ENV] = str(args.nnodes)
        argv = ([args.options_file] if args.options_file else []) + \
            [item for k, v in cli.items() if not is_foreign(k) for item in (f"--{k}", str(v))]
        return _launch(argv, nproc, rendezvous)
    if os.environ.get(_ERROR_DIR):  # a rank of our own launcher: go down with it
        from ..comm.launch import die_with_launcher

        die_with_launcher()
    elif os.environ.get("RANK", "0") == "0":
        _notify(options.notices)
    return _run_rank(options, callbacks)


def _run_rank(options, callbacks) -> int:
    from ..comm import shutdown
    from ..trainer.assembly import run as assemble_and_train
    from ..trainer.loop.interrupt import Interrupted, raising_on_signals

    rank0 = os.environ.get("RANK", "0") == "0"
    try:
        with raising_on_signals():
            assemble_and_train(options, callbacks)
    except TrainingInterrupted as e:
        if rank0:
            print(f"zerotrain: {e}", file=sys.stderr, flush=True)
        shutdown()
        return e.exit_code
    except KeyboardInterrupt as e:  # before the first step: nothing to save
        signum = e.signum if isinstance(e, Interrupted) else 2
        if rank0:
            print(f"zerotrain: interrupted by {'SIGTERM' if signum == 15 else 'SIGINT'} while starting, before any "
                  "training step; nothing was saved", file=sys.stderr, flush=True)
        return 128 + signum
    except _USER_ERRORS as e:
        errors = os.environ.get(_ERROR_DIR)
        if not errors:
            raise
        Path(errors, f"rank{os.environ.get('RANK', '0')}.txt").write_text(str(e), encoding="utf-8")
        shutdown()
        return 2
    shutdown()  # a rank that exits with its gloo group alive can abort in C++ teardown
    return 0
