"""Killing a launched job whole, for the fault-injection scripts (Linux: reads /proc).

torchrun starts each rank in a session of its own, so a SIGKILL to the launcher's process
group misses scripts whose ranks do not die with their launcher; these helpers find every
process below the launcher and kill each one's group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time


def _stat_fields(pid: int | str) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()  # state, ppid, ... (the name may hold spaces)


def descendants(pid: int) -> list[int]:
    """Every process below pid."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                children.setdefault(int(_stat_fields(entry)[1]), []).append(int(entry))
    found, todo = [], list(children.get(pid, []))
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


def alive(pid: int) -> bool:
    """Whether pid runs (a zombie waiting for its reaper does not count)."""
    try:
        return _stat_fields(pid)[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def kill_job(pid: int, timeout: float = 30.0) -> None:
    """SIGKILL the launcher `pid` (a session leader) and everything below it. The launcher
    is stopped first so that it cannot start or reap ranks while they are being found.
    Raises if any process below it is still alive after `timeout`; the caller reaps pid."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGSTOP)
    below = descendants(pid)
    groups = {pid}
    for p in below:
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(p))
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in below):
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {[p for p in below if alive(p)]} of the job survived SIGKILL")
        time.sleep(0.01)
