"""A pool of N real processes in one gloo world, reused across tests.

Spawning a 2-rank world costs ~8 s here, so one pool per size serves the whole session.
`pool.run(fn, *args)` runs a module-level function on every rank at once and returns the
per-rank results in rank order; an exception on any rank fails the test with its traceback,
and the pool is rebuilt for the next test (a rank may be stuck in a collective).
"""

from __future__ import annotations

import datetime
import faulthandler
import multiprocessing as mp
import os
import queue
import socket
import traceback


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, tasks, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    faulthandler.enable()  # a rank that crashes in native code says where
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=90))
    while True:
        item = tasks.get()
        if item is None:
            break
        fn, args, kwargs = item
        try:
            results.put((rank, True, fn(*args, **kwargs)))
        except BaseException:  # report everything, including assertion failures
            results.put((rank, False, traceback.format_exc()))
    dist.destroy_process_group()


class WorldPool:
    def __init__(self, world_size: int):
        self.world_size = world_size
        self.procs = []
        self._start()

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        port = _free_port()
        self.tasks = [ctx.Queue() for _ in range(self.world_size)]
        self.results = ctx.Queue()
        self.procs = [ctx.Process(target=_worker, args=(r, self.world_size, port, self.tasks[r], self.results),
                                  daemon=True) for r in range(self.world_size)]
        for p in self.procs:
            p.start()

    def run(self, fn, *args, timeout: float = 240, **kwargs) -> list:
        for q in self.tasks:
            q.put((fn, args, kwargs))
        out, errors = [None] * self.world_size, []
        try:
            for _ in range(self.world_size):
                rank, ok, value = self.results.get(timeout=timeout)
                if ok:
                    out[rank] = value
                else:
                    errors.append(f"rank {rank}:\n{value}")
        except queue.Empty:
            errors.append(f"timed out after {timeout}s waiting for the ranks")
        if errors:
            self.close()
            self._start()
            raise AssertionError("\n".join(errors))
        return out

    def close(self) -> None:
        for q in self.tasks:
            try:
                q.put(None)
            except Exception:
                pass
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
