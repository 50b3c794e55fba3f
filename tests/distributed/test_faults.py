"""A rank that dies or hangs: the survivor exits with one line naming it, within ddp_timeout.

Each case is a fresh pair of plain processes (rank 0 hosts the rendezvous store, as the
launcher's agent would), so a broken world never leaks into the shared test pools.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

JOB = Path(__file__).with_name("fault_job.py")
TIMEOUT_S = 6.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(mode: str, victim: int, stage: int, own_group: bool = False) -> dict[int, str]:
    port = _free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_RANK=str(rank), OMP_NUM_THREADS="1", FAULT_JOB_OWN_GROUP="1" if own_group else "")
        procs.append(subprocess.Popen([sys.executable, str(JOB), mode, str(victim), str(TIMEOUT_S), str(stage)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    survivor = procs[1 - victim]
    out = {1 - victim: survivor.communicate(timeout=120)[0]}
    procs[victim].kill()  # hung: it would sleep on
    out[victim] = procs[victim].communicate()[0]
    return out


def parse(text: str, tag: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(tag + " ")]


HUNG = "is alive but never joined collective"
DEAD = "stopped sending heartbeats: the process died or is frozen"
STORE_GONE = "the rendezvous store is unreachable: the process hosting it (rank 0"


@pytest.mark.parametrize("mode,victim,stage,expected,own_group", [
    ("hang", 1, 0, HUNG, False), ("die", 1, 2, DEAD, False), ("hang", 0, 3, HUNG, False),
    ("die", 0, 1, STORE_GONE, False),  # rank 0 hosts the store here (under torchrun the agent does)
    ("hang", 1, 1, HUNG, True),  # the script made the process group itself
])
def test_survivor_names_the_dead_or_hung_rank_within_ddp_timeout(mode, victim, stage, expected, own_group):
    out = run_job(mode, victim, stage, own_group)
    survivor = 1 - victim
    errors = parse(out[survivor], "ERROR")
    assert len(errors) == 1, out[survivor][-3000:]
    _, when, message = errors[0].split(" ", 2)
    assert message.startswith(f"[{victim}] rank {survivor}: "), message
    if expected != STORE_GONE:
        assert f": rank {victim} " in message, message
    assert expected in message and "\n" not in message, message
    # the error came within ddp_timeout of the fault (generous slack for a loaded machine)
    fault = parse(out[victim], "FAULT")
    assert len(fault) == 1, out[victim][-3000:]
    assert float(when) - float(fault[0].split()[1]) < TIMEOUT_S + 5
