"""Give freed host memory back to the system.

A model built under zero.Init holds its chunks as many tensors of a few MB, which glibc
serves from its heap; freeing them (as initialize moves them to their shard store or to
NVMe) leaves the pages with this process, so the gradient shards allocated next would be
counted on top of them. `malloc_trim` returns such free pages. Elsewhere (not glibc) it
does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> None:
    trim = _trim()
    if trim is not None:
        trim(0)
