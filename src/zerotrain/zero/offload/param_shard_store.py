"""Where a stage-3 rank keeps its parameter shard: on the compute device, on the host
(offload_param cpu) or in an NVMe file (offload_param nvme). The gatherer only asks for
element ranges, so it does not care which; with nvme, what it has read and not yet sent is
bounded by offload_param's I/O buffers (IOBuffers)."""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from ...errors import ConfigError
from .nvme_swap import FileStore, copy_into

_KEY = "zero_optimization.offload_param"
WRITES_BEHIND = 8  # parameter-shard writes queued at most (each one optimizer block)


class IOBuffers:
    """offload_param's `buffer_count` buffers of at most `buffer_size` elements: the window of
    parameter shards read from NVMe and not yet all-gathered. A read holds a buffer until the
    collective that sends it has been waited for (`settle`); a read when all are held first
    waits for the oldest. Each buffer is allocated at the size of its read and freed after
    it (host_memory.py returns it to the system), so resident memory is at most
    buffer_count x buffer_size elements and usually far less."""

    def __init__(self, count: int, size: int):
        self.count, self.size = count, size
        self.held: deque = deque()  # (tensor, work) in the order read
        self.peak_held = 0

    def check(self, chunks) -> None:
        """`chunks`: (name, full numel, elements per rank) of each parameter in NVMe: each must
        fit in one buffer (one clear line for the largest that does not)."""
        name, numel, chunk = max(chunks, key=lambda c: c[2], default=("", 0, 0))
        if chunk > self.size:
            raise ConfigError(f"{_KEY}.buffer_size is {self.size:,} elements, but parameter {name!r} "
                              f"({numel:,} elements) needs {chunk:,} per rank in one buffer; raise {_KEY}.buffer_size "
                              f"to at least {chunk:,}")

    def send(self, read, launch):
        """`launch(read())` -> its async work, once a buffer is free for the read."""
        if len(self.held) >= self.count:
            self.held.popleft()[1].wait()  # the oldest read has been sent: its buffer is free
        tensor = read()
        work = launch(tensor)
        self.held.append((tensor, work))
        self.peak_held = max(self.peak_held, len(self.held))
        return work

    def settle(self, work) -> None:
        """`work` has been waited for: the buffer it was sending is free."""
        self.held = deque(entry for entry in self.held if entry[1] is not work)


class ParamStore:
    """A zeroed shard of `numel` elements; the strategy fills it chunk by chunk
    (stage3/gather.py: ShardedGroup.fill), so building it never holds more than one parameter's chunk twice."""

    def __init__(self, numel: int, dtype: torch.dtype, kind: str, compute_device, folder=None,
                 name: str = "params", pin: bool = False, io: IOBuffers | None = None):
        self.kind = kind
        self.io = io if kind == "nvme" else None
        self.dtype = dtype
        self.numel = numel
        self.compute_device = torch.device(compute_device)
        self.place = {"none": "device", "cpu": "host", "nvme": "nvme"}[kind]
        self.file = None
        self._writer: ThreadPoolExecutor | None = None  # nvme: writes behind the optimizer step
        self._writes: deque[tuple[int, int, Future]] = deque()  # (lo, hi, write) in the order queued
        self._lock = threading.Lock()  # the step may run on its own thread (step_behind.py)
        if kind == "nvme":
            self.tensor = None
            self.file = FileStore(folder / f"{name}.bin", numel, dtype)  # a sparse file of zeros
        else:
            device = "cpu" if kind == "cpu" else compute_device
            self.tensor = torch.zeros(numel, dtype=dtype, device=device)
            if kind == "cpu" and pin:
                self.tensor = self.tensor.pin_memory()

    def read(self, lo: int, hi: int) -> torch.Tensor:
        """Elements [lo, hi) on the compute device (a view when they already live there)."""
        if self.file is None:
            return self.tensor[lo:hi].to(self.compute_device, non_blocking=True)
        self.flush(lo, hi)
        out = torch.empty(hi - lo, dtype=self.dtype)
        self.file.read_into(lo, out)
        return out.to(self.compute_device)

    def send(self, lo: int, hi: int, launch):
        """`launch(elements [lo, hi) on the compute device)` -> its async work; from NVMe the
        read waits for one of the I/O buffers, which `settle(work)` frees."""
        if self.io is None:
            return launch(self.read(lo, hi))
        return self.io.send(lambda: self.read(lo, hi), launch)

    def settle(self, work) -> None:
        if self.io is not None:
            self.io.settle(work)

    @property
    def max_read(self) -> int | None:
        """The most elements one read may ask for (a buffer), None when unbounded."""
        return self.io.size if self.io is not None else None

    def will_need(self, lo: int, hi: int) -> None:
        """Elements [lo, hi) will be read soon (from NVMe: the kernel starts reading them)."""
        if self.file is not None:
            self.file.will_need(lo, hi - lo)

    def write(self, lo: int, src: torch.Tensor) -> None:
        """Put `src` at lo. To NVMe the write goes behind (one writer thread, at most
        WRITES_BEHIND queued): the optimizer steps the next block meanwhile, and every read
        first waits for the queued writes into its range, every checkpoint for all (flush)."""
        if self.file is None:
            self.tensor[lo : lo + src.numel()].copy_(src)
            return
        values = src.detach().to("cpu", self.dtype)
        if values.data_ptr() == src.data_ptr():
            values = values.clone()  # the caller may reuse src's memory before the write
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zerotrain-param-write")
        while True:
            with self._lock:
                if len(self._writes) < WRITES_BEHIND:
                    break
                oldest = self._writes[0][2]
            self._wait(oldest)
        future = self._writer.submit(self.file.write_from, lo, values)
        with self._lock:
            self._writes.append((lo, lo + values.numel(), future))

    def flush(self, lo: int = 0, hi: int | None = None) -> None:
        """Wait for the queued writes (those into [lo, hi) when given; an error of one, a full
        disk say, is raised here)."""
        hi = self.numel if hi is None else hi
        with self._lock:
            waits = [f for a, b, f in self._writes if a < hi and lo < b]
        for f in waits:
            self._wait(f)

    def _wait(self, future: Future) -> None:
        """Wait for one queued write; forget it and those done before it without error (a
        failed one is forgotten once its error has been raised)."""
        try:
            future.result()
        except BaseException:
            with self._lock:
                self._writes = deque(w for w in self._writes if w[2] is not future)
            raise
        with self._lock:
            while self._writes and self._writes[0][2].done() and self._writes[0][2].exception() is None:
                self._writes.popleft()

    def full(self):
        """The whole shard for a checkpoint: a copy, or its file (copied file to file)."""
        self.flush()
        return self.file if self.file is not None else self.read(0, self.numel).clone()

    def load(self, value) -> None:
        """The whole shard from a checkpoint's tensor or RawTensor."""
        self.flush()
        copy_into(self.file if self.file is not None else self.tensor, value)

    @property
    def nvme_bytes(self) -> int:
        return self.file.nbytes if self.file is not None else 0

    def close(self) -> None:
        if self._writer is not None:
            try:
                self.flush()
            finally:
                self._writer.shutdown()
                self._writer = None
        if self.file is not None:
            self.file.close()
