"""ZeRO-Infinity's files: one flat array per file, read and written by element ranges.

The fp32 masters and optimizer state of blockwise_optimizer.py and the stage-3 parameter
shards of param_shard_store.py live in these under `nvme_path`, one folder per rank and
process. Reads and writes are positional (pread/pwrite), so several can run at once on a
thread pool; the page cache is the kernel's, not this process's memory.

A rank's folder is named `zerotrain-<host>-rank<r>-pid<pid>`: folders that a crashed run of
this host left (their process is gone) are recognised and removed at start, and nothing
else under nvme_path is ever touched. Checkpoints copy these files whole, file to file
(checkpoint/raw_files.py), so saving never holds them in memory.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import socket
import weakref
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from ...errors import ConfigError, DiskFullError


@runtime_checkable
class FileBacked(Protocol):
    """A tensor that lives in a file (a checkpoint's RawTensor): copied file to file."""

    path: Path

    def load(self) -> torch.Tensor: ...


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
        self._window: int | None = None  # bytes the kernel reads ahead per request (will_need)

    def read_into(self, start: int, out: torch.Tensor) -> None:
        view = memoryview(out.view(torch.uint8).numpy())
        got = os.preadv(self.fd, [view], start * self.itemsize)
        if got != len(view):
            raise OSError(f"{self.path}: short read ({got} of {len(view)} bytes)")

    def will_need(self, start: int, count: int) -> None:
        """Elements [start, start + count) will be read soon: the kernel reads them into its
        page cache in the background (posix_fadvise WILLNEED), so the read finds them there.
        Linux reads at most one read-ahead window per call and drops the rest of the range
        silently, so a longer range is asked for one window at a time."""
        if count <= 0 or not hasattr(os, "posix_fadvise"):
            return
        if self._window is None:
            self._window = read_ahead_window(self.fd)
        at, end = start * self.itemsize, (start + count) * self.itemsize
        while at < end:
            step = min(self._window, end - at)
            os.posix_fadvise(self.fd, at, step, os.POSIX_FADV_WILLNEED)
            at += step

    def write_from(self, start: int, src: torch.Tensor) -> None:
        data = memoryview(src.contiguous().view(torch.uint8).numpy())
        offset = start * self.itemsize
        while len(data):  # one pwrite moves at most ~2 GiB
            try:
                done = os.pwrite(self.fd, data, offset)
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise DiskFullError(e.errno, f"offload file {self.path}: the disk is full; free space on it "
                                        "or point nvme_path at a larger disk, then resume from the last "
                                        "checkpoint") from None
                raise
            data, offset = data[done:], offset + done

    def copy_to(self, path: Path) -> None:
        """This file's bytes into a new file at `path`, by the kernel (no copy through memory)."""
        with open(path, "wb") as out:
            _copy_range(self.fd, out.fileno(), self.nbytes)

    def copy_from(self, path: Path) -> None:
        """The bytes of the file at `path` (as copy_to wrote them) into this one."""
        size = os.path.getsize(path)
        if size != self.nbytes:
            raise OSError(f"{path}: {size} bytes, {self.path} holds {self.nbytes}")
        with open(path, "rb") as src:
            os.lseek(self.fd, 0, os.SEEK_SET)
            _copy_range(src.fileno(), self.fd, size)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    def close(self) -> None:
        self._finalizer()


DEFAULT_WINDOW = 128 << 10  # Linux's default read_ahead_kb: the window when sysfs does not say


def read_ahead_window(fd: int) -> int:
    """Bytes one WILLNEED on `fd` reads at most: Linux caps it at the larger of its block
    device's read-ahead window and its largest request (sysfs read_ahead_kb, max_sectors_kb);
    DEFAULT_WINDOW where sysfs does not say (an overlay or network file system)."""
    dev = os.fstat(fd).st_dev
    node = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    try:
        node = node.resolve()
        queue = next(q for q in (node / "queue", node.parent / "queue") if q.is_dir())
        kib = max(int((queue / name).read_text()) for name in ("read_ahead_kb", "max_sectors_kb"))
    except (OSError, StopIteration, ValueError):
        return DEFAULT_WINDOW
    return max(4096, kib << 10)


def _close_and_remove(fd: int, path: Path) -> None:
    """Swap files are scratch space: they go when their store goes (or at exit)."""
    os.close(fd)
    path.unlink(missing_ok=True)
    try:
        path.parent.rmdir()  # the rank folder, once its last file is gone
    except OSError:
        pass


@runtime_checkable
class Ranged(Protocol):
    """A flat array read by element ranges, `value[lo:hi]`: a checkpoint's RawTensor, or a
    rank's piece made for another layout (checkpoint/reshard.py) as it is read."""

    def numel(self) -> int: ...

    def load(self) -> torch.Tensor: ...


COPY_BLOCK = 1 << 22  # elements per range when a Ranged value is copied (16 MB of fp32)


def copy_into(store, value) -> None:
    """Fill a FileStore or a tensor from a tensor, or from a Ranged value a block at a time (a
    RawTensor into a FileStore: file to file)."""
    if isinstance(store, FileStore) and isinstance(value, FileBacked):
        store.copy_from(value.path)
    elif isinstance(value, Ranged) and not torch.is_tensor(value):
        for lo in range(0, value.numel(), COPY_BLOCK):
            part = value[lo : lo + COPY_BLOCK]
            if isinstance(store, FileStore):
                store.write_from(lo, part.to(store.dtype))
            else:
                store[lo : lo + part.numel()].copy_(part)
    elif isinstance(store, FileStore):
        store.write_from(0, value.detach().to("cpu", store.dtype))
    else:
        store.copy_(value)


def _copy_range(src: int, dst: int, nbytes: int) -> None:
    os.lseek(src, 0, os.SEEK_SET)
    left = nbytes
    while left:
        try:
            done = os.copy_file_range(src, dst, left)
        except OSError:  # another file system: plain reads and writes, a MiB at a time
            done = os.write(dst, os.read(src, min(left, 1 << 20)))
        if done == 0:
            raise OSError(f"copy stopped with {left} bytes left")
        left -= done


_HOST = re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"
_FOLDER = re.compile(rf"zerotrain-{re.escape(_HOST)}-rank\d+-pid(\d+)")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_nvme_path(nvme_path: str, needed: int, what: str) -> None:
    """Before anything is written: the folder exists, is writable and has room for `needed`
    bytes of this rank's files (`what` says of which); folders of crashed runs are cleared."""
    base = Path(nvme_path)
    if not base.is_dir():
        raise ConfigError(f"offload nvme_path {nvme_path!r} does not exist; create it, or point nvme_path at a "
                          "folder on a local disk")
    if not os.access(base, os.W_OK | os.X_OK):
        raise ConfigError(f"offload nvme_path {nvme_path!r} is not writable; point nvme_path at a folder this "
                          "process may write to")
    for entry in base.iterdir():
        found = _FOLDER.fullmatch(entry.name)
        if found and entry.is_dir() and int(found.group(1)) != os.getpid() and not _alive(int(found.group(1))):
            shutil.rmtree(entry, ignore_errors=True)  # swap files of a run that crashed here
    free = shutil.disk_usage(base).free
    if free < needed:
        raise ConfigError(f"offload nvme_path {nvme_path!r}: this rank needs {needed:,} bytes ({what}), "
                          f"{free:,} are free; free space there or point nvme_path at a larger disk")


def rank_folder(nvme_path: str, rank: int) -> Path:
    folder = Path(nvme_path) / f"zerotrain-{_HOST}-rank{rank}-pid{os.getpid()}"
    try:
        folder.mkdir(exist_ok=True)
    except FileNotFoundError:
        raise ConfigError(f"offload nvme_path {nvme_path!r} does not exist; create it, or point nvme_path at a "
                          "folder on a local disk") from None
    except OSError as e:
        raise ConfigError(f"offload nvme_path {nvme_path!r} is not writable ({e.strerror}); "
                          "point it at a folder on a local disk") from None
    return folder
