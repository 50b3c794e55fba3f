"""Memory for whole stage-3 parameters: apart from the activations, and recycled.

A stage-3 parameter is whole only while its module runs, so its memory is freed and taken
again several times a step (about 340 MB a step for a 42M-parameter GPT). Through the C
allocator those buffers land between the activations and leave holes in the heap at the
activation peak: 45 MiB more peak RSS per rank for that GPT than with the pages below.

On Linux, CPU parameters live instead in one private anonymous mapping, each at a
page-aligned slot of its own for life. Releasing a parameter moves its pages out to a side
mapping (mremap: page tables change, no byte is copied) and leaves the slot reading zeros;
gathering a parameter moves pooled pages of its size back in, so no page is zero-filled
again. The pool keeps one layer's worth of pages at most (a transformer's layers repeat the
same shapes); beyond that the oldest pooled pages go back to the system.

Elsewhere (an accelerator, another OS, a kernel without MREMAP_DONTUNMAP, a sandbox that
forbids mremap, a model without repeated shapes) each parameter keeps a buffer of its own
whose storage is freed and allocated again.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import sys
from collections import Counter, OrderedDict

import torch

_PAGE = mmap.PAGESIZE
_MAYMOVE, _FIXED, _DONTUNMAP = 1, 2, 4


def whole_buffers(numels: list[int], dtype: torch.dtype, device) -> "OwnStorages | MovedPages":
    """A buffer per parameter (`buffers[i]`, numels[i] elements), empty until `acquire(i)`."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    sizes = [-(-n * itemsize // _PAGE) * _PAGE for n in numels]
    layer = layer_bytes(sizes)
    if torch.device(device).type == "cpu" and sys.platform.startswith("linux") and layer:
        try:
            return MovedPages(numels, sizes, dtype, layer)
        except (OSError, AttributeError, ValueError):  # no mremap, or not the flags we need
            pass
    return OwnStorages(numels, dtype, device)


class OwnStorages:
    """A storage per parameter, resized to zero bytes when released."""

    def __init__(self, numels: list[int], dtype: torch.dtype, device):
        self.buffers = [torch.empty(n, dtype=dtype, device=device) for n in numels]
        self.nbytes = [b.untyped_storage().nbytes() for b in self.buffers]
        for b in self.buffers:
            b.untyped_storage().resize_(0)

    def acquire(self, i: int) -> None:
        self.buffers[i].untyped_storage().resize_(self.nbytes[i])

    def release(self, i: int) -> None:
        self.buffers[i].untyped_storage().resize_(0)


class MovedPages:
    """Slots in one anonymous mapping; released pages wait in a second one (see module doc)."""

    def __init__(self, numels: list[int], sizes: list[int], dtype: torch.dtype, limit: int):
        self.sizes, self.limit = sizes, limit
        self.offsets, total = [], 0
        for size in sizes:
            self.offsets.append(total)
            total += size
        spare, total = total, total + _PAGE  # one page to try the moves on before relying on them
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        self.slots, self.pool = mmap.mmap(-1, total, flags=flags), mmap.mmap(-1, total, flags=flags)
        for region in (self.slots, self.pool):
            region.madvise(mmap.MADV_NOHUGEPAGE)  # every move would split a huge page
        raw = torch.frombuffer(self.slots, dtype=torch.uint8)
        self.base = raw.data_ptr()
        self.pool_base = torch.frombuffer(self.pool, dtype=torch.uint8).data_ptr()
        self._mremap = ctypes.CDLL(None, use_errno=True).mremap
        self._mremap.restype = ctypes.c_void_p
        self._mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        raw[spare] = 1
        if not (self._move(self.base + spare, self.pool_base + spare, _PAGE)
                and self._move(self.pool_base + spare, self.base + spare, _PAGE) and raw[spare] == 1):
            raise OSError(ctypes.get_errno(), "mremap cannot move pages here")
        itemsize = torch.empty((), dtype=dtype).element_size()
        self.buffers = [raw[o : o + n * itemsize].view(dtype) for o, n in zip(self.offsets, numels)]
        self.pooled: OrderedDict[int, int] = OrderedDict()  # slot whose pages are pooled -> size
        self.pooled_bytes = 0

    def _move(self, src: int, dst: int, size: int) -> bool:
        """Pages from src to dst. The source stays mapped (empty, reading zeros): a hole in
        either mapping could be handed to someone else's mmap, and unmapping ours at the end
        would then take theirs with it."""
        return self._mremap(src, size, size, _MAYMOVE | _FIXED | _DONTUNMAP, dst) == dst

    def _drop(self, region: mmap.mmap, i: int) -> None:
        region.madvise(mmap.MADV_DONTNEED, self.offsets[i], self.sizes[i])

    def acquire(self, i: int) -> None:
        """Pooled pages of this size into slot i, its own first. Without any, the kernel
        zero-fills the slot's pages as they are written."""
        size = self.sizes[i]
        if not size:
            return
        donor = i if i in self.pooled else next((j for j, s in self.pooled.items() if s == size), None)
        if donor is None:
            return
        del self.pooled[donor]
        self.pooled_bytes -= size
        if not self._move(self.pool_base + self.offsets[donor], self.base + self.offsets[i], size):
            self._drop(self.pool, donor)  # the slot is still empty: it fills as it is written

    def release(self, i: int) -> None:
        size = self.sizes[i]
        if not size:
            return
        if i in self.pooled:  # released twice without a gather: forget the older pages
            del self.pooled[i]
            self.pooled_bytes -= size
            self._drop(self.pool, i)
        offset = self.offsets[i]
        if size > self.limit or not self._move(self.base + offset, self.pool_base + offset, size):
            self._drop(self.slots, i)
            return
        self.pooled[i] = size
        self.pooled_bytes += size
        while self.pooled_bytes > self.limit:
            j, s = self.pooled.popitem(last=False)
            self.pooled_bytes -= s
            self._drop(self.pool, j)


def layer_bytes(sizes: list[int]) -> int:
    """One layer of a model whose layers repeat: every size that occurs more than once, as
    often as it occurs per occurrence of the rarest of them (a GPT block: the attention's
    two matrices once, the MLP's two equal ones twice). 0 when no size repeats."""
    repeated = {s: c for s, c in Counter(sizes).items() if c > 1 and s}
    if not repeated:
        return 0
    layers = min(repeated.values())
    return sum(s * math.ceil(c / layers) for s, c in repeated.items())
