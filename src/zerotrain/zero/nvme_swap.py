"""ZeRO-Infinity offload: optimizer state (and stage-3 parameter shards) in NVMe files.

Each rank's fp32 master shard is stepped block by block (`block_numel` elements). For a
block, the optimizer's state tensors are read from their files into one of two buffer
slots, the torch optimizer steps that block in the slot, and the state is written back
while the next block is already being read into the other slot:

    read  b0 | read  b1 | read  b2 |
             | step  b0 | step  b1 | step b2
             |          | write b0 | write b1 | write b2

Reads and writes are positional (pread/pwrite) on a thread pool, which releases the GIL, so
I/O overlaps the optimizer kernel. Only the two slots are resident; the rest of the state
lives in files (the page cache is the kernel's, not this process's memory).
"""

from __future__ import annotations

import os
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
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


class SwappedOptimizer:
    """A torch optimizer whose state lives in files; steps fp32 master shards by block.

    The engine and LR schedulers see an optimizer: `param_groups` (one per group, holding
    the master shard), `step()`, `state_dict()` and `load_state_dict()`.
    """

    def __init__(self, build, groups: list[dict], folder: Path, block_numel: int, pool: ThreadPoolExecutor):
        self.masters = [g["params"][0] for g in groups]
        self.folder = folder
        self.block = max(1, min(block_numel, max(m.numel() for m in self.masters)))
        self.pool = pool
        # Two slot parameters per group; the inner optimizer steps whichever has a .grad.
        self.slots = [[torch.nn.Parameter(torch.zeros(1, dtype=torch.float32)) for _ in range(2)]
                      for _ in self.masters]
        self.inner = build([dict({k: v for k, v in g.items() if k != "params"}, params=slots)
                            for g, slots in zip(groups, self.slots)])
        self.param_groups = self.inner.param_groups
        self.defaults = self.inner.defaults
        self.steps = [0 for _ in self.masters]
        self.stores: dict[tuple[int, str], FileStore] = {}
        self.state_keys: list[str] = []  # the optimizer's per-element state tensors, e.g. exp_avg

    @property
    def state(self) -> dict:
        return {}  # nothing resident; see nvme_bytes()

    def nvme_bytes(self) -> int:
        return sum(s.nbytes for s in self.stores.values())

    def _blocks(self, gi: int):
        n = self.masters[gi].numel()
        return [(lo, min(lo + self.block, n)) for lo in range(0, n, self.block)]

    def _store(self, gi: int, key: str) -> FileStore:
        if (gi, key) not in self.stores:
            self.stores[(gi, key)] = FileStore(self.folder / f"group{gi}.{key}.bin", self.masters[gi].numel(),
                                               torch.float32)
        return self.stores[(gi, key)]

    def _read(self, gi: int, lo: int, hi: int) -> tuple[dict, list[Future]]:
        buffers = {k: torch.empty(hi - lo, dtype=torch.float32) for k in self.state_keys}
        futures = [self.pool.submit(self._store(gi, k).read_into, lo, buf) for k, buf in buffers.items()]
        return buffers, futures

    @torch.no_grad()
    def step(self, closure=None):
        for gi, master in enumerate(self.masters):
            blocks = self._blocks(gi)
            writes: list[list[Future]] = []
            ahead = self._read(gi, *blocks[0]) if self.steps[gi] else ({}, [])
            for b, (lo, hi) in enumerate(blocks):
                buffers, reads = ahead
                if b + 1 < len(blocks) and self.steps[gi]:
                    ahead = self._read(gi, *blocks[b + 1])
                for f in reads:
                    f.result()
                slot = self.slots[gi][b % 2]
                slot.data = master.data[lo:hi]  # the step writes the master in place
                slot.grad = master.grad[lo:hi]
                state = self.inner.state[slot]
                state.clear()
                if self.steps[gi]:
                    state.update(buffers, step=torch.tensor(float(self.steps[gi])))
                self.inner.step()
                slot.grad = None
                if not self.state_keys:  # first step: learn which state tensors to keep
                    self.state_keys = [k for k, v in state.items()
                                       if torch.is_tensor(v) and v.numel() == hi - lo and k != "step"]
                writes.append([self.pool.submit(self._store(gi, key).write_from, lo, state[key])
                               for key in self.state_keys])
                state.clear()
                if len(writes) > 2:  # keep at most two blocks of state in flight
                    for f in writes.pop(0):
                        f.result()
            for block_writes in writes:
                for f in block_writes:
                    f.result()
            self.steps[gi] += 1

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Gradients belong to the strategy's shards; nothing to clear here."""

    def state_dict(self) -> dict:
        state = {}
        for (gi, key), store in self.stores.items():
            full = torch.empty(store.numel, dtype=torch.float32)
            store.read_into(0, full)
            state.setdefault(gi, {})[key] = full
        return {"state": state, "steps": list(self.steps), "keys": list(self.state_keys),
                "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]}

    def load_state_dict(self, saved: dict) -> None:
        self.steps = list(saved["steps"])
        self.state_keys = list(saved["keys"])
        for gi, tensors in saved["state"].items():
            for key, full in tensors.items():
                self._store(int(gi), key).write_from(0, full)
        for group, hyper in zip(self.param_groups, saved["param_groups"]):
            group.update(hyper)

    def close(self) -> None:
        for store in self.stores.values():
            store.close()
