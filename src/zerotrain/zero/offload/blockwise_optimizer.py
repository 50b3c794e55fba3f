"""fp32 master weights kept apart from the model, stepped block by block.

When the model computes in fp16/bf16, or the optimizer is offloaded, the fp32 masters are
not the model's own tensors. Each trained group then has one fp32 master shard (this rank's
part) and its optimizer state, both on the compute device, on the host (offload cpu) or in
files (offload nvme). `BlockwiseOptimizer` steps them `block` elements at a time:

    master + state of block b      resident views, or read from their files ahead of use
    gradient of block b            the strategy's reduced gradient (compute dtype) -> fp32 x coef
    step                           torch's own optimizer over one slot parameter
    model shard[b] <- master b     cast to the compute dtype (stage 3: into its shard store)
    (nvme) write master + state b  while the next block is read and stepped

    read  b0 | read  b1 | read  b2 |
             | step  b0 | step  b1 | step b2
             |          | write b0 | write b1 | write b2

So no fp32 copy of the gradients persists (the ZeRO paper's 16 bytes per parameter with
Adam: 2 + 2 + 12), and with nvme host memory holds offload_optimizer.buffer_count blocks
(master + state) at once, never a shard: one stepped, one read ahead, the rest being written
(4: two writes behind; 1: read, step and write one after the other). Those buffers are
allocated once and reused, block after block. A block's reads (and then its writes) are
one task on a thread pool, positional (pread/pwrite), which release the GIL; the kernel is
asked to read the block READ_AHEAD blocks later into its page cache meanwhile
(posix_fadvise), so the disk always has reads queued. At stage 3 the nvme step may run on a
thread of its own behind the next forward, from the end of each shard (step_behind.py).
Blocks are only correct for optimizers that update each element on its own (SGD, Adam,
...); any other optimizer steps each group as one block. State that is not one value per
element (a client optimizer's counters, scalars) is kept per block as the optimizer left it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from .nvme_swap import FileStore, Ranged, copy_into
from .step_behind import StepBehind, settled

# torch optimizers whose update of an element reads only that element (and scalars)
ELEMENTWISE = frozenset({"SGD", "Adam", "AdamW", "Adagrad", "RMSprop", "Adamax", "NAdam", "RAdam", "Rprop",
                         "ASGD", "UncorrectedAdam"})
RESIDENT_BLOCK_NUMEL = 1 << 22  # 16 MB of fp32 per temporary gradient block
READ_AHEAD = 8  # nvme: blocks beyond the one being read handed to the kernel's read-ahead


@dataclass
class MasterGroup:
    """One trained group as the strategy shows it to the optimizer."""

    numel: int
    grad: torch.Tensor  # the reduced gradient shard (still loss-scaled), read block by block
    read_model: Callable[[int, int], torch.Tensor]  # elements [lo, hi) of the model's shard
    write_model: Callable[[int, torch.Tensor], None]  # put updated values at lo


class BlockwiseOptimizer(torch.optim.Optimizer):
    """A torch optimizer (param_groups, step, state_dict) over fp32 masters it keeps itself."""

    def __init__(self, build, hyper: list[dict], groups: list[MasterGroup], *, device: torch.device,
                 pin: bool = False, folder=None, block_numel: int = RESIDENT_BLOCK_NUMEL, pool=None,
                 buffer_count: int = 4):
        self.groups, self.device, self.pin, self.folder, self.pool = groups, device, pin, folder, pool
        self.buffer_count = max(1, buffer_count)  # nvme: blocks in host memory at once
        self._free: list[torch.Tensor] = []  # nvme: block buffers (1 + state rows) not in use
        self._in_use = self.peak_buffers = 0  # nvme: block buffers in use now, at most
        self._grad_buffer: torch.Tensor | None = None  # the fp32 copy of one gradient block
        self.coef = 1.0  # unscale x clip of the coming step (ZeroStrategy.prepare_step)
        #: whether step() only starts the step, on its thread, behind the next forward (the
        #: strategy decides: stage 3 with these masters in NVMe); `behind` is that step
        self.runs_behind = False
        self.behind = StepBehind()
        self.slots = [[torch.nn.Parameter(torch.zeros(1, dtype=torch.float32, device=device)) for _ in range(2)]
                      for _ in groups]
        self.inner = build([dict(h, params=slots) for h, slots in zip(hyper, self.slots)])
        super().__init__([s for slots in self.slots for s in slots], self.inner.defaults)
        self.param_groups = self.inner.param_groups  # schedulers write the inner optimizer's lr
        self.state = {}  # resident state tensors by group, for memory accounting
        elementwise = type(self.inner).__name__ in ELEMENTWISE
        self.blocks = [max(1, min(block_numel, g.numel)) if elementwise else max(1, g.numel) for g in groups]
        self.steps = [0 for _ in groups]
        self.state_keys: list[str] = []  # the per-element state tensors, learned at the first step
        self.keeps_step = True  # whether the optimizer keeps a "step" entry (torch's do), idem
        self.extra: dict[tuple[int, int], dict] = {}  # (group, block) -> its other state entries
        self.masters: list[torch.Tensor | None] = []
        self.master_files: list[FileStore | None] = []
        self.state_files: dict[tuple[int, str], FileStore] = {}
        for gi, g in enumerate(groups):
            if folder is None:
                self.masters.append(self._resident(g.numel))
                self.master_files.append(None)
            else:
                self.masters.append(None)
                self.master_files.append(FileStore(folder / f"group{gi}.master.bin", g.numel, torch.float32))
        self.load_masters(None)

    # ---- storage -----------------------------------------------------------------------------
    def _resident(self, numel: int) -> torch.Tensor:
        t = torch.zeros(numel, dtype=torch.float32, device=self.device)
        return t.pin_memory() if self.pin else t

    def _ranges(self, gi: int):
        n, b = self.groups[gi].numel, self.blocks[gi]
        return [(lo, min(lo + b, n)) for lo in range(0, n, b)]

    @settled
    def load_masters(self, saved: list[torch.Tensor] | None, to_model: bool = False) -> None:
        """Masters from `saved` (a checkpoint), else from the model's own values, block by
        block; `to_model` also writes saved masters into the model (cast to its dtype)."""
        for gi, g in enumerate(self.groups):
            for lo, hi in self._ranges(gi):
                values = saved[gi][lo:hi] if saved is not None else g.read_model(lo, hi)
                self.write_master(gi, lo, values)
                if to_model and saved is not None:
                    g.write_model(lo, values)

    @settled
    def write_master(self, gi: int, lo: int, values: torch.Tensor) -> None:
        values = values.detach().to(self.device, torch.float32)
        if self.masters[gi] is not None:
            self.masters[gi][lo : lo + values.numel()].copy_(values)
        else:
            self.master_files[gi].write_from(lo, values.cpu())

    @settled
    def master(self, gi: int) -> torch.Tensor:
        """The whole fp32 master of group gi (read from its file with nvme)."""
        if self.masters[gi] is not None:
            return self.masters[gi]
        out = torch.empty(self.groups[gi].numel, dtype=torch.float32)
        self.master_files[gi].read_into(0, out)
        return out

    @settled
    def master_state(self, gi: int):
        """What a checkpoint saves of group gi's master: a copy, or its file (copied file to file)."""
        return self.masters[gi].detach().clone() if self.masters[gi] is not None else self.master_files[gi]

    def _state_tensor(self, gi: int, key: str) -> torch.Tensor | FileStore:
        if self.folder is not None:
            if (gi, key) not in self.state_files:
                self.state_files[(gi, key)] = FileStore(self.folder / f"group{gi}.{key}.bin",
                                                        self.groups[gi].numel, torch.float32)
            return self.state_files[(gi, key)]
        group_state = self.state.setdefault(gi, {})
        if key not in group_state:
            group_state[key] = self._resident(self.groups[gi].numel)
        return group_state[key]

    def _files(self, gi: int, written: bool = False) -> list[FileStore]:
        """The files a block of group gi is read from (its master, then its state once it has
        any) or `written` to (its master and its state)."""
        return [self.master_files[gi]] + ([self._state_tensor(gi, k) for k in self.state_keys]
                                          if self.steps[gi] or written else [])

    def _read(self, item):
        """(master, state, read, buffer) of a plan item's block: views when resident; with
        nvme, views of a block buffer being filled by one pool task (`read`, its future; the
        buffer goes back to `_free` once written)."""
        gi, _, lo, hi = item
        if self.folder is None:
            state = {k: self._state_tensor(gi, k)[lo:hi] for k in self.state_keys} if self.steps[gi] else {}
            return self.masters[gi][lo:hi], state, None, None
        rows = 1 + len(self.state_keys)
        buffer = self._free.pop() if self._free else None
        if buffer is None or buffer.shape[0] < rows:  # none yet, or made before the state was known
            buffer = torch.empty(rows, max(self.blocks), dtype=torch.float32)
        self._in_use += 1
        self.peak_buffers = max(self.peak_buffers, self._in_use)
        files = self._files(gi)
        views = [buffer[row, : hi - lo] for row in range(len(files))]
        state = dict(zip(self.state_keys, views[1:]))
        return views[0], state, self.pool.submit(_read_rows, files, lo, views), buffer

    def _hint(self, items) -> None:
        """nvme: the kernel starts reading these plan items' blocks (READ_AHEAD blocks ahead)."""
        if self.folder is not None:
            for gi, _, lo, hi in items:
                for f in self._files(gi):
                    f.will_need(lo, hi - lo)

    def _grad(self, g: MasterGroup, lo: int, hi: int) -> torch.Tensor:
        """The block's gradient in fp32 where the step runs: a view when it is so already,
        else a copy into one reused buffer (a temporary for a whole group that a
        non-elementwise optimizer steps at once: that would be a shard kept for good)."""
        grad = g.grad[lo:hi]
        if grad.dtype == torch.float32 and grad.device == self.device:
            return grad
        if max(self.blocks) > RESIDENT_BLOCK_NUMEL:
            return grad.to(self.device, torch.float32)
        if self._grad_buffer is None:
            self._grad_buffer = torch.empty(max(self.blocks), dtype=torch.float32, device=self.device)
        return self._grad_buffer[: hi - lo].copy_(grad)

    @settled
    def read_ahead(self, nbytes: int) -> None:
        """Ask the kernel (from an I/O thread: a large WILLNEED may wait on the disk's queue)
        to read the first `nbytes` of what the next step reads, in the order it reads them,
        into its page cache; the step's own reads then find them there. A hint only: its
        future is not waited for."""
        if self.folder is None or nbytes <= 0:
            return
        plan, count = self._plan(backwards=self.runs_behind), 0
        while count < len(plan) and nbytes > 0:
            gi, _, lo, hi = plan[count]
            nbytes -= 4 * len(self._files(gi)) * (hi - lo)
            count += 1
        self.pool.submit(self._hint, plan[:count])

    # ---- the step ----------------------------------------------------------------------------
    def _plan(self, backwards: bool = False) -> list[tuple[int, int, int, int]]:
        """(group, block, lo, hi) in the order stepped: each group from its start, or (behind
        the forward, which needs the end of each shard first: layout order is reverse
        registration) from the end of every group at once, interleaved by position."""
        plan = [(gi, b, lo, hi) for gi in range(len(self.groups)) for b, (lo, hi) in enumerate(self._ranges(gi))]
        if backwards:
            plan.sort(key=lambda t: (-t[2] / self.groups[t[0]].numel, t[0]))
        return plan

    def step(self, closure=None):
        """The step, or (`runs_behind`) its start on the step's thread (step_behind.py), with
        this step's coefficient and hyperparameters: a scheduler may change them meanwhile."""
        coef, self.coef = self.coef, 1.0
        if not self.runs_behind:
            self.behind.join()
            self._run(self._plan(), coef)
            return
        hyper = [dict(g) for g in self.param_groups]
        self.behind.start([g.numel for g in self.groups],
                          lambda mark: self._run(self._plan(backwards=True), coef, hyper, mark))

    @torch.no_grad()
    def _run(self, plan, coef: float, hyper: list[dict] | None = None, mark=None) -> None:
        if hyper is not None:
            self.inner.param_groups = hyper
        try:
            self._run_blocks(plan, coef, mark)
        finally:
            self.inner.param_groups = self.param_groups

    def _run_blocks(self, plan, coef: float, mark) -> None:
        # nvme: one block stepped, one read ahead when two fit, the rest written behind
        read_ahead = self.folder is None or self.buffer_count >= 2
        most_writes = self.buffer_count - 1 - read_ahead
        writes: list[tuple[Future, torch.Tensor]] = []
        self._hint(plan[1 : READ_AHEAD + 1])
        ahead = self._read(plan[0])
        for at, (gi, b, lo, hi) in enumerate(plan):
            g = self.groups[gi]
            master, state_in, read, buffer = ahead
            if at + 1 < len(plan) and read_ahead:
                ahead = self._read(plan[at + 1])
            self._hint(plan[at + READ_AHEAD + 1 : at + READ_AHEAD + 2])
            if read is not None:
                read.result()
            # fp32 on this device already: a view, scaled in place (the strategy clears it
            # after the step anyway); otherwise a copy of one block
            grad = self._grad(g, lo, hi)
            if coef != 1.0:
                grad.mul_(coef)
            slot = self.slots[gi][b % 2]
            slot.data, slot.grad = master, grad
            state = self.inner.state[slot]
            state.clear()
            if self.steps[gi]:
                state.update(self.extra.get((gi, b), {}), **state_in)
                if self.keeps_step:
                    state["step"] = torch.tensor(float(self.steps[gi]))
            self.inner.step()
            slot.grad = None
            if not self.state_keys and not self.steps[gi]:  # the first block ever: learn the state's form
                self.state_keys = [k for k, v in state.items()
                                   if torch.is_tensor(v) and v.numel() == hi - lo and k != "step"]
                self.keeps_step = "step" in state
            self.extra[(gi, b)] = {k: v for k, v in state.items() if k not in self.state_keys and k != "step"}
            g.write_model(lo, master)
            if mark is not None:  # queued: a read of the model's shard there waits for the write
                mark(gi, lo)
            if self.folder is None:
                if not self.steps[gi]:  # first step: the optimizer made fresh state tensors
                    for key in self.state_keys:
                        self._state_tensor(gi, key)[lo:hi].copy_(state[key])
            else:
                rows = [master] + [state[key] for key in self.state_keys]
                writes.append((self.pool.submit(_write_rows, self._files(gi, written=True), lo, rows), buffer))
                while len(writes) > most_writes:
                    self._written(*writes.pop(0))
                if at + 1 < len(plan) and not read_ahead:
                    ahead = self._read(plan[at + 1])
            state.clear()
        for block_writes in writes:
            self._written(*block_writes)
        for gi in range(len(self.groups)):  # every plan holds every group
            self.steps[gi] += 1

    def _written(self, write: Future, buffer: torch.Tensor) -> None:
        write.result()
        self._free.append(buffer)
        self._in_use -= 1

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Gradients belong to the strategy's shards; it clears them."""

    # ---- checkpoints and accounting ----------------------------------------------------------
    @settled
    def state_dict(self) -> dict:
        """torch's layout, one entry per group: step and each per-element state tensor, whole."""
        state = {}
        for gi, g in enumerate(self.groups):
            if not self.steps[gi]:
                continue
            entry = {"step": torch.tensor(float(self.steps[gi])), **self._extra_entry(gi)}
            for key in self.state_keys:  # files are copied file to file by the checkpoint writer
                store = self._state_tensor(gi, key)
                entry[key] = store if isinstance(store, FileStore) else store.detach().clone()
            state[gi] = entry
        return {"state": state, "param_groups": [{k: v for k, v in pg.items() if k != "params"}
                                                 for pg in self.param_groups]}

    def _extra_entry(self, gi: int) -> dict:
        """A group's other state entries: torch's flat layout for one block, else by block."""
        blocks = [self.extra.get((gi, b), {}) for b in range(len(self._ranges(gi)))]
        return dict(blocks[0]) if len(blocks) == 1 else {"blocks": blocks} if any(blocks) else {}

    @settled
    def load_state_dict(self, saved: dict) -> None:
        for gi, entry in saved["state"].items():
            gi = int(gi)
            self.steps[gi] = int(entry["step"])
            n = self.groups[gi].numel
            keys = [k for k in entry if k not in ("step", "blocks") and (
                k in self.state_keys or isinstance(entry[k], Ranged)
                or (torch.is_tensor(entry[k]) and entry[k].numel() == n))]
            self.state_keys = self.state_keys or keys
            for key in keys:
                copy_into(self._state_tensor(gi, key), entry[key])
            other = {k: v for k, v in entry.items() if k not in keys and k not in ("step", "blocks")}
            for b, block in enumerate(entry.get("blocks") or [other]):
                self.extra[(gi, b)] = dict(block)
        for group, hyper in zip(self.param_groups, saved["param_groups"]):
            group.update(hyper)

    def nvme_bytes(self) -> dict[str, int]:
        return {"master_params": sum(f.nbytes for f in self.master_files if f is not None),
                "optimizer_states": sum(f.nbytes for f in self.state_files.values())}

    def close(self) -> None:
        self.behind.close()
        for store in [*self.master_files, *self.state_files.values()]:
            if store is not None:
                store.close()


def _read_rows(files: list[FileStore], lo: int, rows: list[torch.Tensor]) -> None:
    """One pool task per block: fewer hand-offs between threads than one per file."""
    for f, row in zip(files, rows):
        f.read_into(lo, row)


def _write_rows(files: list[FileStore], lo: int, rows: list[torch.Tensor]) -> None:
    for f, row in zip(files, rows):
        f.write_from(lo, row)
