"""Naming the rank that broke a collective.

When a rank dies, gloo and NCCL report a closed connection; when a rank hangs, the others wait
out the process group's timeout and get "timed out". Neither says which rank. So every rank
publishes, from a daemon thread, a heartbeat to the rendezvous store: how many beats it has
sent (alive?) and how many collectives it has entered (where is it?), counted per process
group: ranks of different pipeline stages enter different numbers of data-parallel
collectives, so only counts of the same group compare. A rank whose collective fails reads
them twice, two and a half beats apart: a rank whose beats stopped has died or is frozen; a
rank of the failed collective's group that beats but has entered fewer of that group's
collectives than this one is hung elsewhere.
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
        self.collectives = 0  # bumped by Comm on every collective of the whole world
        self.group_calls: dict[tuple[int, ...], int] = {}  # the same, per subgroup (its global ranks)
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

    def count(self, members: tuple[int, ...] | None) -> int:
        """One more collective entered in the world (None) or in the subgroup `members`."""
        if members is None:
            self.collectives += 1
            return self.collectives
        self.group_calls[members] = self.group_calls.get(members, 0) + 1
        return self.group_calls[members]

    def _publish(self) -> None:
        self._beats += 1
        groups = ",".join(f"{'-'.join(map(str, k))}={v}" for k, v in self.group_calls.items())
        self.store.set(f"{_PREFIX}{self.rank}", f"{self._beats} {self.collectives} {groups}".rstrip())

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

    def _read(self, members: tuple[int, ...] | None) -> list[tuple[int, int] | None]:
        """Every rank's (beats, collectives of `members`' group); raises when the store is gone."""
        self.store.get(f"{_PREFIX}{self.rank}")
        want = None if members is None else "-".join(map(str, members))
        out = []
        for r in range(self.world_size):
            try:
                beats, calls, *groups = self.store.get(f"{_PREFIX}{r}").decode().split()
                if want is not None:
                    counts = dict(g.split("=") for g in groups[0].split(",")) if groups else {}
                    calls = counts.get(want, "0")
                out.append((int(beats), int(calls)))
            except Exception:  # that rank never published
                out.append(None)
        return out

    def diagnose(self, members: tuple[int, ...] | None = None) -> tuple[list[int], str]:
        """(culprit ranks, one-line explanation) for a collective of the world (None) or of the
        subgroup `members` that just failed here."""
        mine = self.collectives if members is None else self.group_calls.get(members, 0)
        try:
            first = self._read(members)
            time.sleep(2.5 * self.interval_s)
            second = self._read(members)
        except Exception:
            return [0], ("the rendezvous store is unreachable: the process hosting it (rank 0, or the "
                         "launcher's agent) is gone")
        dead = [r for r in range(self.world_size) if r != self.rank
                and (second[r] is None or (first[r] is not None and second[r][0] == first[r][0]))]
        behind = [r for r in range(self.world_size) if r != self.rank and r not in dead
                  and (members is None or r in members) and second[r] is not None and second[r][1] < mine]
        parts = []
        if dead:
            at = ", ".join(f"rank {r}" + (f" (after {second[r][1]} collectives)" if second[r] else "") for r in dead)
            parts.append(f"{at} stopped sending heartbeats: the process died or is frozen")
        if behind:
            at = ", ".join(f"rank {r} (at collective {second[r][1]})" for r in behind)
            parts.append(f"{at} is alive but never joined collective {mine} that this rank waited in: "
                         "it is hung or took a different code path")
        return dead + behind, "; ".join(parts)
