"""Naming the rank that broke a collective.

When a rank dies, gloo and NCCL report a closed connection; when a rank hangs, the others wait
out the process group's timeout and get "timed out". Neither says which rank. So every rank
publishes, from a daemon thread, a heartbeat to the rendezvous store: how many beats it has
sent (alive?) and how many collectives it has entered (where is it?). A rank whose collective
fails reads them twice, two and a half beats apart: a rank whose beats stopped has died or is
frozen; a rank that beats but has entered fewer collectives than this one is hung elsewhere.
"""

from __future__ import annotations

import threading
import time

_PREFIX = "zerotrain/heartbeat/"


class Heartbeat:
    def __init__(self, store, rank: int, world_size: int, interval_s: float = 0.5):
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.interval_s = interval_s
        self.collectives = 0  # bumped by Comm on every collective this process enters
        self._beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zerotrain-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._publish()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.interval_s)

    def _publish(self) -> None:
        self._beats += 1
        self.store.set(f"{_PREFIX}{self.rank}", f"{self._beats} {self.collectives}")

    @property
    def alive(self) -> bool:
        """False once stopped or once its store went away (a group destroyed without
        dist.shutdown): a new group then gets a new heartbeat."""
        return self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._publish()
            except Exception:  # the store's host is gone: nothing left to tell anyone
                return

    def _read(self) -> list[tuple[int, int] | None]:
        """Every rank's (beats, collectives); raises when the store itself is gone."""
        self.store.get(f"{_PREFIX}{self.rank}")
        out = []
        for r in range(self.world_size):
            try:
                beats, calls = self.store.get(f"{_PREFIX}{r}").decode().split()
                out.append((int(beats), int(calls)))
            except Exception:  # that rank never published
                out.append(None)
        return out

    def diagnose(self) -> tuple[list[int], str]:
        """(culprit ranks, one-line explanation) for a collective that just failed here."""
        mine = self.collectives
        try:
            first = self._read()
            time.sleep(2.5 * self.interval_s)
            second = self._read()
        except Exception:
            return [0], ("the rendezvous store is unreachable: the process hosting it (rank 0, or the "
                         "launcher's agent) is gone")
        dead = [r for r in range(self.world_size) if r != self.rank
                and (second[r] is None or (first[r] is not None and second[r][0] == first[r][0]))]
        behind = [r for r in range(self.world_size) if r != self.rank and r not in dead
                  and second[r] is not None and second[r][1] < mine]
        parts = []
        if dead:
            at = ", ".join(f"rank {r}" + (f" (after {second[r][1]} collectives)" if second[r] else "") for r in dead)
            parts.append(f"{at} stopped sending heartbeats: the process died or is frozen")
        if behind:
            at = ", ".join(f"rank {r} (at collective {second[r][1]})" for r in behind)
            parts.append(f"{at} is alive but never joined collective {mine} that this rank waited in: "
                         "it is hung or took a different code path")
        return dead + behind, "; ".join(parts)
