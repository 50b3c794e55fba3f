"""Start N local ranks of a module through torch.distributed.run (torchrun), never a
launcher of our own."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys


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
    """Hide torchrun's own failure report (the caller explains the failure in one line)."""
    logger = logging.getLogger("torch.distributed.elastic")
    level = logger.level
    if quiet:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def launch_module(module: str, args: list[str], nproc: int, quiet: bool = False) -> int:
    """Run `python -m module *args` on `nproc` local ranks; returns the job's exit code (the
    first failed rank's code when one fails). `quiet` drops torchrun's failure report."""
    return run_ranks(module, args, nproc, quiet)[0]


def run_ranks(module: str, args: list[str], nproc: int, quiet: bool = False) -> tuple[int, int | None]:
    """launch_module that also says which rank failed first: (exit code, rank or None)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        with _quiet_elastic(quiet):
            # --standalone: the rendezvous binds a free port itself, so no other job can take
            # the port between choosing it and binding it
            torchrun(["--standalone", "--nproc_per_node", str(nproc), "-m", module, *args])
    except SystemExit as e:
        return int(e.code or 0), None
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        if not quiet:  # the failing rank's traceback is printed above
            print(f"zerotrain: {module} failed on rank {rank} (exit code {failure.exitcode})", flush=True)
        code = failure.exitcode if isinstance(failure.exitcode, int) and failure.exitcode > 0 else 1
        return code, rank
    except Exception as e:
        print(f"zerotrain: {module} failed on a rank ({e.__class__.__name__})", flush=True)
        return 1, None
    return 0, None
