"""Start N local ranks of a module through torch.distributed.run (torchrun), never a
launcher of our own."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys

# --nnodes as the launcher of each node was given it, for the ranks to compare (trainer/preflight.py)
NNODES_ENV = "ZEROTRAIN_NNODES"


def die_with_launcher() -> None:
    """In a rank started by launch_module: die when the launcher dies. torchrun starts each
    rank in a session of its own, so a SIGKILL to the launcher's process group would
    otherwise leave the ranks training on, orphaned, into the same output_dir."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG; the parent is torchrun's agent
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the launcher was already gone before prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _quiet_elastic(quiet: bool):
    """Hide torchrun's own reports (the caller explains a failure or an interrupt in one line).
    torch's elastic modules each set their own logger's level, so each is quieted by name."""
    names = [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed.elastic")]
    loggers = [logging.getLogger(n) for n in ["torch.distributed.elastic", *names]]
    levels = [logger.level for logger in loggers]
    if quiet:
        for logger in loggers:
            logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def launch_module(module: str, args: list[str], nproc: int, quiet: bool = False) -> int:
    """Run `python -m module *args` on `nproc` local ranks; returns the job's exit code (the
    first failed rank's code when one fails). `quiet` drops torchrun's failure report."""
    return run_ranks(module, args, nproc, quiet)[0]


def run_ranks(module: str, args: list[str], nproc: int, quiet: bool = False,
              rendezvous: list[str] | None = None) -> tuple[int, int | None]:
    """launch_module that also says which rank failed first: (exit code, rank or None).
    `rendezvous`: torchrun's multi-node options (--nnodes, --node_rank, --master_addr, ...) in
    place of --standalone. A signal to this process (Ctrl-C) reaches the ranks through
    torchrun's agent; the code is then the shell's 128 + signal."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError
    from torch.distributed.run import main as torchrun

    from ..errors import ConfigError

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # --standalone: the rendezvous binds a free port itself, so no other job can take the port
    # between choosing it and binding it
    where = rendezvous if rendezvous else ["--standalone"]
    try:
        with _quiet_elastic(quiet):
            torchrun([*where, "--nproc_per_node", str(nproc), "-m", module, *args])
    except SystemExit as e:
        return int(e.code or 0), None
    except SignalException as e:
        return 128 + int(e.sigval), None
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        if not quiet:  # the failing rank's traceback is printed above
            print(f"zerotrain: {module} failed on rank {rank} (exit code {failure.exitcode})", flush=True)
        code = failure.exitcode if isinstance(failure.exitcode, int) and failure.exitcode > 0 else 1
        return code, rank
    except RendezvousError as e:
        detail = " ".join(str(e).split())[:200] or type(e).__name__
        raise ConfigError(f"the nodes did not meet at the rendezvous ({type(e).__name__}: {detail}); start the same "
                          "command on every node with the same --nnodes and each its own --node_rank") from None
    except Exception as e:
        print(f"zerotrain: {module} failed on a rank ({e.__class__.__name__})", flush=True)
        return 1, None
    return 0, None
