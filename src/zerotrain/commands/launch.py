"""`zerotrain launch`: the `deepspeed` launcher's command line, started through torchrun.

    zerotrain launch --num_gpus 8 train.py --deepspeed --deepspeed_config ds.json

On one node the ranks start here, each running the script with `--local_rank=<n>` put before
its own arguments (as the `deepspeed` launcher passes it; `--no_local_rank` leaves it out) and
torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT in the environment. With
a hostfile naming several hosts, the command prints the torchrun command for each host (start
each on its host, or run `zerotrain launch --no_ssh --node_rank R ...` there with the same
hostfile); nothing is started over ssh.

The hostfile is DeepSpeed's: one `hostname slots=N` a line, `#` comments. `--include` and
`--exclude` take DeepSpeed's `host1:0,1@host2` (a host alone: all of its slots).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from ..errors import ConfigError

DEFAULT_HOSTFILE = "/job/hostfile"
_REFUSED = {
    "--autotuning": "autotuning is not built; tune with `zerotrain estimate` and the config",
    "--elastic_training": "elastic training is not built; torchrun's own --nnodes MIN:MAX can restart a job",
    "--bind_cores_to_rank": "core binding is not built; set OMP_NUM_THREADS and taskset yourself",
    "--bind_core_list": "core binding is not built; set OMP_NUM_THREADS and taskset yourself",
    "--no_python": "scripts are run with this Python; call the program from a Python script",
    "--min_elastic_nodes": "elastic training is not built",
    "--max_elastic_nodes": "elastic training is not built",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-H", "--hostfile", default=DEFAULT_HOSTFILE,
                        help="DeepSpeed hostfile (`host slots=N` lines); absent: this node only")
    parser.add_argument("-i", "--include", default="", help="hosts and slots to use: host1:0,1@host2")
    parser.add_argument("-e", "--exclude", default="", help="hosts and slots to leave out: host1:0@host2")
    parser.add_argument("--num_nodes", type=int, default=-1, help="use the first N hosts")
    parser.add_argument("--num_gpus", "--num_accelerators", type=int, default=-1, dest="num_gpus",
                        help="ranks per node (default: every GPU, or 1 on a CPU machine)")
    parser.add_argument("--master_addr", default="", help="address of rank 0's node (default: the first host)")
    parser.add_argument("--master_port", type=int, default=29500, help="rendezvous port")
    parser.add_argument("--node_rank", type=int, default=-1, help="with --no_ssh: this node's place in the hostfile")
    parser.add_argument("--no_ssh", action="store_true", help="start only this node's ranks (each node runs it)")
    parser.add_argument("--launcher", default="pdsh", help="pdsh, openmpi, ...: only ssh-style printing is built")
    parser.add_argument("--module", action="store_true", help="the script is a module name (python -m)")
    parser.add_argument("--no_local_rank", action="store_true", help="do not pass --local_rank to the script")
    parser.add_argument("--force_multi", action="store_true", help="treat one host as a multi-node job")
    for option in _REFUSED:  # DeepSpeed's, refused in one line at run()
        parser.add_argument(option, nargs="?", const=True, default=None, help=argparse.SUPPRESS)
    parser.add_argument("user_script", help="the training script (or module with --module)")
    parser.add_argument("user_args", nargs=argparse.REMAINDER, help="the script's own arguments")


def read_hostfile(path: str) -> dict[str, int] | None:
    """{host: slots} in file order, or None when the file does not exist."""
    if not os.path.isfile(path):
        return None
    hosts: dict[str, int] = {}
    for n, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].startswith("slots=") or not parts[1][6:].isdigit():
            raise ConfigError(f"{path} line {n}: {raw.strip()!r} is not `hostname slots=N`")
        if parts[0] in hosts:
            raise ConfigError(f"{path} line {n}: host {parts[0]} is listed twice")
        hosts[parts[0]] = int(parts[1][6:])
    if not hosts:
        raise ConfigError(f"{path} names no host")
    return hosts


def _parse_filter(text: str, hosts: dict[str, list[int]], what: str) -> dict[str, list[int] | None]:
    """`host1:0,1@host2` -> {host1: [0, 1], host2: None (every slot)}."""
    out: dict[str, list[int] | None] = {}
    for part in filter(None, text.split("@")):
        host, _, slots = part.partition(":")
        if host not in hosts:
            raise ConfigError(f"--{what} {text}: host {host!r} is not in the hostfile ({', '.join(hosts)})")
        if not slots:
            out[host] = None
            continue
        try:
            chosen = [int(s) for s in slots.split(",")]
        except ValueError:
            raise ConfigError(f"--{what} {text}: slots of {host} must be numbers, got {slots!r}") from None
        bad = [s for s in chosen if s not in hosts[host]]
        if bad:
            raise ConfigError(f"--{what} {text}: {host} has no slot {bad[0]} (it has {hosts[host]})")
        out[host] = chosen
    return out


def resources(hosts: dict[str, int], include: str = "", exclude: str = "", num_nodes: int = -1,
              num_gpus: int = -1) -> dict[str, list[int]]:
    """The hosts and slots to start ranks on, in hostfile order, as the `deepspeed` launcher
    chooses them: include or exclude first, then the first `num_nodes` hosts and the first
    `num_gpus` slots of each."""
    if include and exclude:
        raise ConfigError("--include and --exclude cannot both be given; keep one")
    pool = {host: list(range(n)) for host, n in hosts.items()}
    if include:
        chosen = _parse_filter(include, pool, "include")
        pool = {h: (chosen[h] if chosen[h] is not None else s) for h, s in pool.items() if h in chosen}
    elif exclude:
        dropped = _parse_filter(exclude, pool, "exclude")
        pool = {h: [s for s in slots if s not in (dropped.get(h) or [])]
                for h, slots in pool.items() if not (h in dropped and dropped[h] is None)}
    pool = {h: s for h, s in pool.items() if s}
    if num_nodes > 0:
        if num_nodes > len(pool):
            raise ConfigError(f"--num_nodes {num_nodes}: only {len(pool)} hosts are available ({', '.join(pool)})")
        pool = dict(list(pool.items())[:num_nodes])
    if num_gpus > 0:
        short = [h for h, s in pool.items() if len(s) < num_gpus]
        if short:
            raise ConfigError(f"--num_gpus {num_gpus}: {short[0]} has {len(pool[short[0]])} slots")
        pool = {h: s[:num_gpus] for h, s in pool.items()}
    if not pool:
        raise ConfigError("no host or slot is left to start ranks on; check --include / --exclude")
    return pool


def _local_slots(num_gpus: int) -> int:
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count and num_gpus > count:
        raise ConfigError(f"--num_gpus {num_gpus}: this node has {count} GPUs")
    return num_gpus if num_gpus > 0 else max(count, 1)


def _rank_args(args) -> list[str]:
    """What torchrun runs on each rank: the shim, then the script and its arguments."""
    return [args.user_script, *args.user_args]


def _environment(args, slots: list[int] | None) -> dict[str, str]:
    env = {"ZEROTRAIN_LAUNCH_LOCAL_RANK": "0" if args.no_local_rank else "1",
           "ZEROTRAIN_LAUNCH_MODULE": "1" if args.module else "0"}
    if slots is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, slots))
    return env


def _torchrun() -> str:
    """torchrun of this Python's environment (the hosts are expected to share it), else the one on PATH."""
    here = Path(sys.executable).parent / "torchrun"
    return str(here) if here.exists() else "torchrun"


def host_commands(args, pool: dict[str, list[int]]) -> list[str]:
    """The command to start on each host of a multi-node job."""
    master = args.master_addr or next(iter(pool))
    lines = []
    for rank, (host, slots) in enumerate(pool.items()):
        env = " ".join(f"{k}={v}" for k, v in _environment(args, slots).items())
        torchrun = [_torchrun(), "--nnodes", str(len(pool)), "--node_rank",
                    str(rank), "--nproc_per_node", str(len(slots)), "--master_addr", master, "--master_port",
                    str(args.master_port), "-m", "zerotrain.commands.launch_rank", *_rank_args(args)]
        lines.append(f"ssh {host} {shlex.quote(f'cd {shlex.quote(os.getcwd())} && {env} {shlex.join(torchrun)}')}")
    return lines


def run(args) -> int:
    for option, why in _REFUSED.items():
        if getattr(args, option[2:]) is not None:
            raise ConfigError(f"zerotrain launch {option}: {why}")
    if args.launcher not in ("pdsh", "ssh"):
        raise ConfigError(f"--launcher {args.launcher}: zerotrain launch starts ranks with torchrun (one command a "
                          "node); MPI-family launchers are not built")
    hosts = read_hostfile(args.hostfile)
    if hosts is None:
        if args.hostfile != DEFAULT_HOSTFILE:
            raise ConfigError(f"--hostfile {args.hostfile}: no such file")
        if args.num_nodes > 1:
            raise ConfigError(f"--num_nodes {args.num_nodes} needs a hostfile (`host slots=N` lines) naming the nodes")
        pool = {"localhost": list(range(_local_slots(args.num_gpus)))}
        pool = resources({"localhost": len(pool["localhost"])}, args.include, args.exclude)
    else:
        pool = resources(hosts, args.include, args.exclude, args.num_nodes, args.num_gpus)
    from ..comm.launch import run_ranks

    if len(pool) > 1 or args.force_multi:
        if not args.no_ssh:
            print("zerotrain launch: a job over several hosts; start this on each host:")
            print("\n".join(host_commands(args, pool)))
            return 0
        if not 0 <= args.node_rank < len(pool):
            raise ConfigError(f"--no_ssh needs --node_rank between 0 and {len(pool) - 1} (this node's place in "
                              "the hostfile)")
        host, slots = list(pool.items())[args.node_rank]
        master = args.master_addr or next(iter(pool))
        rendezvous = ["--nnodes", str(len(pool)), "--node_rank", str(args.node_rank), "--master_addr", master,
                      "--master_port", str(args.master_port)]
    else:
        (host, slots), = pool.items()
        rendezvous = ["--nnodes", "1", "--node_rank", "0", "--master_addr", args.master_addr or "127.0.0.1",
                      "--master_port", str(args.master_port)] if args.master_addr else None
    import torch

    all_slots = hosts is None and slots == list(range(len(slots)))
    os.environ.update(_environment(args, None if all_slots or not torch.cuda.is_available() else slots))
    return run_ranks("zerotrain.commands.launch_rank", _rank_args(args), len(slots), rendezvous=rendezvous)[0]
