"""Start N local ranks of a module through torch.distributed.run (torchrun), never a
launcher of our own."""

from __future__ import annotations

import os
import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_module(module: str, args: list[str], nproc: int) -> int:
    """Run `python -m module *args` on `nproc` local ranks; returns the job's exit code."""
    from torch.distributed.run import main as torchrun

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        torchrun(["--nproc_per_node", str(nproc), "--master_port", str(free_port()), "-m", module, *args])
    except SystemExit as e:
        return int(e.code or 0)
    except Exception as e:  # ChildFailedError: the failing rank's traceback is printed above
        print(f"zerotrain: {module} failed on a rank ({e.__class__.__name__})", flush=True)
        return 1
    return 0
