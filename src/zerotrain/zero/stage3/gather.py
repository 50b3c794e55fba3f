"""Stage 3 parameter storage: every parameter cut into N equal chunks, one per rank.

    full p (n elements, padded to N*c)   | chunk 0 | chunk 1 | ... | chunk N-1 |
    rank r's shard buffer                | c(p0) of rank r | c(p1) of rank r | ... |

A rank's shard buffer is the concatenation of its chunk of every parameter of the group, in
layout order (reverse registration), so the parameters of one module sit next to each other
and one all-gather of that range brings the whole module back: the gathered rows are then
copied out (one split_with_sizes_copy) into the params' own buffers. A run of a single
parameter is gathered straight into that parameter's buffer, whose layout (chunk of rank 0,
chunk of rank 1, ...) is the gathered one. Releasing a parameter points its data at an empty
tensor again; where the buffers' memory comes from is pages.py's business.
"""

from __future__ import annotations

import torch

from ..layout import CHUNKED, GroupLayout, cut, glue
from .init import full_shape, is_partitioned
from .pages import whole_buffers


class ShardedGroup(GroupLayout):
    """One param group's parameters and their chunked layout (zero/layout.py); the reducer reads
    it like a FlatGroup, in shard space."""

    def __init__(self, params: list[torch.nn.Parameter], world_size: int):
        self.params = list(params)
        self.shapes = [full_shape(p) for p in self.params]
        super().__init__([s.numel() for s in self.shapes], world_size, CHUNKED)

    def fill(self, write, rank: int, dtype: torch.dtype) -> None:
        """Write this rank's chunk of every (still whole) parameter at its offset, with
        `write(offset, chunk)`: one parameter at a time, each whole one freed as it goes."""
        for p, o in zip(self.params, self.offsets):
            if is_partitioned(p):  # built under zero.Init: this rank's chunk already exists
                write(o, p.zt_chunk.to(dtype))
                del p.zt_chunk
            else:
                write(o, cut(p.detach().reshape(-1), self.world_size)[rank].to(dtype))
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)

    def runs(self, indices: list[int], most: int | None = None) -> list[tuple[int, int, list[int]]]:
        """Split the given params into contiguous shard ranges: [(lo, hi, indices)], each of at
        most `most` elements when given (one parameter's chunk may still exceed it)."""
        out = []
        for i in sorted(indices, key=lambda i: self.offsets[i]):
            lo, hi = self.offsets[i], self.offsets[i] + self.numels[i]
            if out and out[-1][1] == lo and (most is None or hi - out[-1][0] <= most):
                out[-1] = (out[-1][0], hi, out[-1][2] + [i])
            else:
                out.append((lo, hi, [i]))
        return out


class _Pending:
    """All-gathers launched for one set of parameters, not yet copied out."""

    def __init__(self):
        self.runs = []  # (group index, param indices, gathered buffer, work handle)


class Gatherer:
    """Brings parameters back whole (all-gather + copy-out) and releases them again.

    `start` launches the all-gathers asynchronously (prefetch); `gather` finishes whatever is
    in flight for the given parameters and fetches the rest. `live_numel` counts elements of
    whole (or arriving) parameters; its high-water mark is what stage3_max_live_parameters
    bounds.

    Each parameter keeps one padded buffer (one storage) for its whole value for life.
    Releasing frees the buffer's memory in place and points `p.data` at an empty tensor;
    gathering brings memory back under the same buffer and points `p.data` at it. Only
    swapping `p.data` would free nothing: autograd keeps views of the weights it saved for
    backward (e.g. `weight.t()` in a linear layer), and those views share the buffer, so
    they see the values again once backward's gather refills it. A released parameter reads
    as an empty tensor, never as freed memory.
    """

    def __init__(self, groups: list[ShardedGroup], stores: list, comm, persistent: set[int], device, dtype):
        self.groups = groups
        self.stores = stores  # offload/param_shard_store.ParamStore per group
        self.comm = comm
        self.persistent = persistent  # ids of params kept whole once gathered
        self.whole: dict[int, torch.nn.Parameter] = {}  # id -> param, for params now whole
        self.in_flight: dict[int, _Pending] = {}
        self.numel_of = {id(p): n for g in groups for p, n in zip(g.params, g.full_numels)}
        self.live_numel = 0
        self.peak_live_numel = 0
        self.device, self.dtype = device, dtype
        self._empty = torch.empty(0, dtype=dtype, device=device)
        params = [p for g in groups for p in g.params]
        self.memory = whole_buffers([comm.world_size * c for g in groups for c in g.numels], dtype, device)
        self.slot_of = {id(p): i for i, p in enumerate(params)}  # index into self.memory.buffers
        for p in params:
            p.data = self._empty
        #: ready(group, lo, hi) returns once that shard range holds the latest step's values
        #: (the step may still run behind: offload/step_behind.py)
        self.ready = _always_ready

    @property
    def reads_files(self) -> bool:
        """Whether some shard store reads from NVMe (read-ahead is worth asking for)."""
        return any(store.file is not None for store in self.stores)

    def _absent(self, gi: int, indices: list[int]) -> list[int]:
        """Those of group gi's `indices` that are neither whole nor arriving."""
        params = self.groups[gi].params
        return [i for i in indices if id(params[i]) not in self.whole and id(params[i]) not in self.in_flight]

    def advise(self, own: dict[int, list[int]]) -> None:
        """The given parameters will be gathered soon: stores in NVMe start reading them."""
        for gi, indices in own.items():
            for lo, hi, _ in self.groups[gi].runs(self._absent(gi, indices)):
                self.stores[gi].will_need(lo, hi)

    def missing_numel(self, own: dict[int, list[int]]) -> int:
        return sum(self.groups[gi].full_numels[i] for gi, idx in own.items() for i in self._absent(gi, idx))

    def start(self, own: dict[int, list[int]]) -> _Pending:
        pending = _Pending()
        ws = self.comm.world_size
        for gi, indices in own.items():
            group, store = self.groups[gi], self.stores[gi]
            todo = self._absent(gi, indices)
            # small persistent params (biases, norms) apart from the large ones: a large
            # parameter alone in its run is gathered straight into its buffer, with no scratch
            # copy allocated between the activations
            small = [i for i in todo if id(group.params[i]) in self.persistent]
            large = [i for i in todo if id(group.params[i]) not in self.persistent]
            for lo, hi, run in group.runs(large, store.max_read) + group.runs(small, store.max_read):
                self.ready(gi, lo, hi)
                if len(run) == 1:  # the parameter's own buffer is the gathered layout: no copy-out
                    slot = self.slot_of[id(group.params[run[0]])]
                    self.memory.acquire(slot)
                    gathered = self.memory.buffers[slot]
                else:
                    gathered = torch.empty(ws * (hi - lo), dtype=self.dtype, device=self.device)
                work = store.send(lo, hi, lambda shard, out=gathered: self.comm.all_gather(out, shard, async_op=True))
                pending.runs.append((gi, run, gathered, work))
                for i in run:
                    self.in_flight[id(group.params[i])] = pending
                    self.live_numel += group.full_numels[i]
        self.peak_live_numel = max(self.peak_live_numel, self.live_numel)
        return pending

    def finish(self, pending: _Pending) -> None:
        ws = self.comm.world_size
        for gi, run, gathered, work in pending.runs:
            work.wait()
            self.stores[gi].settle(work)
            group = self.groups[gi]
            sizes = [group.numels[i] for i in run]
            slots = [self.slot_of[id(group.params[i])] for i in run]
            buffers = [self.memory.buffers[slot] for slot in slots]
            direct = gathered is buffers[0]  # gathered straight into the parameter (see start)
            for buffer, slot, i in zip(buffers, slots, run):
                if not direct:
                    self.memory.acquire(slot)
                group.params[i].data = glue(buffer, group.shapes[i])
            if not direct:
                torch.split_with_sizes_copy(gathered.view(ws, -1), sizes, dim=1,
                                            out=[b.view(ws, c) for b, c in zip(buffers, sizes)])
            for i in run:
                p = group.params[i]
                self.whole[id(p)] = p
                del self.in_flight[id(p)]
        pending.runs = []

    def gather(self, own: dict[int, list[int]]) -> None:
        """Make the given parameters whole now (waiting for any prefetch of them)."""
        for gi, indices in own.items():
            for i in indices:
                pending = self.in_flight.get(id(self.groups[gi].params[i]))
                if pending is not None:
                    self.finish(pending)
        self.finish(self.start(own))

    def drain(self) -> None:
        """Finish every prefetch still in flight (unused prefetches become whole params)."""
        for pending in list({id(p): p for p in self.in_flight.values()}.values()):
            self.finish(pending)

    def release(self, params, force: bool = False) -> None:
        for p in params:
            if id(p) in self.whole and (force or id(p) not in self.persistent):
                self.memory.release(self.slot_of[id(p)])
                p.data = self._empty
                del self.whole[id(p)]
                self.live_numel -= self.numel_of[id(p)]

    def release_all(self, force: bool = False) -> None:
        self.drain()
        self.release(list(self.whole.values()), force=force)


def _always_ready(gi: int, lo: int, hi: int) -> None:
    """No step runs behind."""
