"""ZeRO-Infinity's optimizer step, run behind the next forward.

With the fp32 masters and the optimizer state in NVMe files, the step is the disk's work
(read 12 bytes, write 14 per parameter) while forward and backward are the processor's. So
at stage 3 `engine.step()` hands the step to a thread and returns, and the two overlap:

    engine.step()       norm, coefficient (as ever) -> the step starts on its thread
    next forward        each gather first waits for its parameters' blocks (`wait`): the
                        step goes from the end of the shard (the first layers, in layout
                        order) to its start, so the forward follows it layer by layer
    next backward       waits for the whole step (`join`): it reduces into the gradient
                        shards the step reads, then clears them

The arithmetic is the synchronous step's, block for block: only its timing moves. Whatever
reads the masters, the optimizer state or the shards as a whole (a checkpoint, a consolidated
state dict, GatheredParameters' write-back, destroy) joins first; an error of the step (a
full disk, say) is raised there or by the gather that waits for it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor


class StepBehind:
    """One step in flight at most: which of each group's elements it has written to the model."""

    def __init__(self):
        self._cond = threading.Condition()
        self._ready_from: list[int] = []  # per group: elements [ready_from, numel) are written
        self._future: Future | None = None
        self._then: list[Callable[[], None]] = []  # run in the caller's thread once joined
        self._thread: ThreadPoolExecutor | None = None
        self._failed = False

    @property
    def running(self) -> bool:
        return self._future is not None

    def start(self, numels: list[int], run: Callable[[Callable], None]) -> None:
        """Run `run(mark)` on the step's thread; `run` calls mark(group, lo) once elements
        [lo, numel) of that group are written to the model (it goes from the end down)."""
        self.join()
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zerotrain-step")
        self._ready_from, self._failed = list(numels), False
        self._future = self._thread.submit(self._body, run)

    def _body(self, run) -> None:
        try:
            run(self.mark)
        except BaseException:
            self._failed = True
            raise
        finally:  # done or failed: no waiter waits any longer
            with self._cond:
                self._ready_from = [0] * len(self._ready_from)
                self._cond.notify_all()

    def then(self, fn: Callable[[], None]) -> None:
        """Call `fn` after the running step is joined (at once when none runs)."""
        if self._future is None:
            fn()
        else:
            self._then.append(fn)

    def mark(self, gi: int, lo: int) -> None:
        with self._cond:
            if lo < self._ready_from[gi]:
                self._ready_from[gi] = lo
            self._cond.notify_all()

    def wait(self, gi: int, lo: int, hi: int) -> None:
        """Return once group gi's elements [lo, hi) hold the running step's values."""
        if self._future is None or gi >= len(self._ready_from):  # a frozen group: never stepped
            return
        with self._cond:
            self._cond.wait_for(lambda: self._ready_from[gi] <= lo)
        if self._failed:
            self.join()  # raises the step's error

    def join(self) -> None:
        """Wait for the running step (raising its error) and run what waited for it."""
        future, self._future = self._future, None
        if future is None:
            return
        try:
            future.result()
        finally:
            then, self._then = self._then, []
            for fn in then:
                fn()

    def close(self) -> None:
        try:
            self.join()
        finally:
            if self._thread is not None:
                self._thread.shutdown()
                self._thread = None


def settled(method):
    """Decorate a method of an object with a `behind` (StepBehind): it runs once the step in
    flight, if any, has finished."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        self.behind.join()
        return method(self, *args, **kwargs)

    return wrapper
