"""Freed step temporaries go back to the system: with glibc's dynamic mmap threshold, blocks of
a few MB freed between longer-lived small ones stay with the process (the heap cannot shrink
past them); with the threshold fixed by return_large_blocks they are unmapped when freed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HOST_MEMORY = Path(__file__).resolve().parents[4] / "src" / "zerotrain" / "zero" / "offload" / "host_memory.py"

# numpy allocates through malloc as torch's CPU tensors do, and starts in a fraction of the time
PROBE = """
import importlib.util, sys
import numpy as np
spec = importlib.util.spec_from_file_location("host_memory", sys.argv[1])
host_memory = importlib.util.module_from_spec(spec)
spec.loader.exec_module(host_memory)
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
def returned():
    big = 6 << 20  # bytes: a layer's gradient, say
    kept, temps = [], []
    for _ in range(40):
        temps.append(np.ones(big, np.uint8))
        kept.append(np.ones(4096, np.uint8))  # small, long-lived, between the temporaries
    before = rss()
    del temps
    return (before - rss()) / (40 * big)
if sys.argv[2] == "fixed":
    assert host_memory.return_large_blocks()
first = np.ones(6 << 20, np.uint8); del first  # glibc's dynamic threshold rises to this size
print(returned())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_large_freed_blocks_leave_the_process():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    dynamic, fixed = (float(subprocess.run([sys.executable, "-c", PROBE, str(HOST_MEMORY), how], env=env,
                                           capture_output=True, text=True, check=True).stdout)
                      for how in ("dynamic", "fixed"))
    assert dynamic < 0.2  # why return_large_blocks exists: glibc keeps them
    assert fixed > 0.9


def test_the_trimmer_trims_at_boundaries_and_every_nth_event(monkeypatch):
    from zerotrain.zero.offload import host_memory

    trims = []
    monkeypatch.setattr(host_memory, "release_freed_memory", lambda: trims.append(1))
    every = host_memory.Trimmer(every=3)
    for _ in range(7):
        every.tick()
    assert len(trims) == 2  # after the 3rd and the 6th
    every.now()
    assert len(trims) == 3
    never = host_memory.Trimmer(every=0)
    never.tick(), never.now()
    assert len(trims) == 3
