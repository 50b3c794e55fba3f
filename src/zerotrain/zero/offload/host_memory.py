"""How this process's host memory goes back to the system (glibc's malloc; elsewhere nothing).

Two habits of glibc cost a training process memory that it no longer uses:

- Its mmap threshold is dynamic: once a block served by mmap is freed, blocks up to that size
  (up to 32 MiB) come from the heap from then on. A stage-3 step's temporaries of a few MB (a
  layer's gradient before it is cut into its bucket, the buckets) are then carved from the
  heap between longer-lived tensors, and their pages stay with the process once freed: the
  peak RSS of a bf16 GPT at 2 ranks grew ~10 bytes per parameter per rank, against the
  ZeRO paper's 8, and step over step. `return_large_blocks` (called where host memory is the
  ceiling: stage 3 with parameters or optimizer states offloaded, zero.Init with a
  remote_device) fixes the threshold at LARGE_BLOCK, so every block that large is mapped on its own and
  unmapped when freed: 8.4 bytes, no growth. The price is page faults: such blocks are
  zero-filled anew each time (~+0.5 s of system time a step for 59M parameters at 64 tokens
  a rank). The user's MALLOC_MMAP_THRESHOLD_ wins.
- A model built under zero.Init holds its chunks as many tensors of a few MB; freeing them
  (as initialize moves them to their shard store or to NVMe) leaves free heap pages with this
  process. `release_freed_memory` (malloc_trim) returns them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

LARGE_BLOCK = 4 << 20  # bytes: blocks at least this large are mapped and unmapped on their own
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


@functools.cache
def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


@functools.cache
def return_large_blocks() -> bool:
    """Fix malloc's mmap threshold at LARGE_BLOCK, once per process; False where it cannot
    (not glibc) or the user chose one (MALLOC_MMAP_THRESHOLD_ in the environment)."""
    libc = _libc()
    if libc is None or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, LARGE_BLOCK))


def release_freed_memory() -> None:
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


class Trimmer:
    """`release_freed_memory` at the phase boundaries (`now`) and every `every` events of a
    phase (`tick`); `every` 0: never. Stage 3 with offload trims this way: a forward or
    backward of a 1.23B GPT leaves up to 1.2 GiB of freed blocks of 2-4 MB in the heap's
    holes, resident until trimmed (an mmap threshold of 2 MiB returns them too, but its page
    faults cost 40-60% of such a step)."""

    def __init__(self, every: int):
        self.every, self._count = every, 0

    def tick(self) -> None:
        self._count += 1
        if self.every and self._count % self.every == 0:
            release_freed_memory()

    def now(self) -> None:
        if self.every:
            release_freed_memory()
