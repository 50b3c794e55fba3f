"""ZeRO-Infinity's files: one flat array per file, read and written by element ranges.

The fp32 masters and optimizer state of blockwise_optimizer.py and the stage-3 parameter
shards of param_shard_store.py live in these under `nvme_path`, one folder per rank and
process. Reads and writes are positional (pread/pwrite), so several can run at once on a
thread pool; the page cache is the kernel's, not this process's memory.
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path

import torch

from ..errors import ConfigError


class FileStore:
    """One flat array in one file, read and written by element ranges."""

    def __init__(self, path: Path, numel: int, dtype: torch.dtype):
        self.path = path
        self.numel = numel
        self.dtype = dtype
        self.itemsize = torch.empty((), dtype=dtype).element_size()
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.ftruncate(self.fd, numel * self.itemsize)
        self._finalizer = weakref.finalize(self, _close_and_remove, self.fd, path)

    def read_into(self, start: int, out: torch.Tensor) -> None:
        view = memoryview(out.view(torch.uint8).numpy())
        got = os.preadv(self.fd, [view], start * self.itemsize)
        if got != len(view):
            raise OSError(f"{self.path}: short read ({got} of {len(view)} bytes)")

    def write_from(self, start: int, src: torch.Tensor) -> None:
        os.pwrite(self.fd, memoryview(src.contiguous().view(torch.uint8).numpy()), start * self.itemsize)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    def close(self) -> None:
        self._finalizer()


def _close_and_remove(fd: int, path: Path) -> None:
    """Swap files are scratch space: they go when their store goes (or at exit)."""
    os.close(fd)
    path.unlink(missing_ok=True)
    try:
        path.parent.rmdir()  # the rank folder, once its last file is gone
    except OSError:
        pass


def rank_folder(nvme_path: str, rank: int) -> Path:
    folder = Path(nvme_path) / f"zerotrain-rank{rank}-pid{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"offload nvme_path {nvme_path!r} is not writable ({e.strerror}); "
                          "point it at a folder on a local disk") from None
    return folder
