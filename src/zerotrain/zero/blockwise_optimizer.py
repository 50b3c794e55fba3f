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
allocated once and reused, block after block. Reads and writes are positional
(pread/pwrite) on a thread pool, which releases the GIL; the kernel is asked to read the
next READ_AHEAD blocks into its page cache meanwhile (posix_fadvise), so the disk always has
reads queued.
Blocks are only correct for optimizers that update each element on its own (SGD, Adam,
...); any other optimizer steps each group as one block. State that is not one value per
element (a client optimizer's counters, scalars) is kept per block as the optimizer left it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from .nvme_swap import FileBacked, FileStore, copy_into

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

    def load_masters(self, saved: list[torch.Tensor] | None, to_model: bool = False) -> None:
        """Masters from `saved` (a checkpoint), else from the model's own values, block by
        block; `to_model` also writes saved masters into the model (cast to its dtype)."""
        for gi, g in enumerate(self.groups):
            for lo, hi in self._ranges(gi):
                values = saved[gi][lo:hi] if saved is not None else g.read_model(lo, hi)
                self.write_master(gi, lo, values)
                if to_model and saved is not None:
                    g.write_model(lo, values)

    def write_master(self, gi: int, lo: int, values: torch.Tensor) -> None:
        values = values.detach().to(self.device, torch.float32)
        if self.masters[gi] is not None:
            self.masters[gi][lo : lo + values.numel()].copy_(values)
        else:
            self.master_files[gi].write_from(lo, values.cpu())

    def master(self, gi: int) -> torch.Tensor:
        """The whole fp32 master of group gi (read from its file with nvme)."""
        if self.masters[gi] is not None:
            return self.masters[gi]
        out = torch.empty(self.groups[gi].numel, dtype=torch.float32)
        self.master_files[gi].read_into(0, out)
        return out

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

    def _read(self, gi: int, lo: int, hi: int):
        """(master, state, reads, buffer) of a block: views when resident; with nvme, views of
        a block buffer being filled (the buffer goes back to `_free` once written)."""
        if self.folder is None:
            state = {k: self._state_tensor(gi, k)[lo:hi] for k in self.state_keys} if self.steps[gi] else {}
            return self.masters[gi][lo:hi], state, [], None
        rows = 1 + len(self.state_keys)
        buffer = self._free.pop() if self._free else None
        if buffer is None or buffer.shape[0] < rows:  # none yet, or made before the state was known
            buffer = torch.empty(rows, max(self.blocks), dtype=torch.float32)
        self._in_use += 1
        self.peak_buffers = max(self.peak_buffers, self._in_use)
        master = buffer[0, : hi - lo]
        futures = [self.pool.submit(self.master_files[gi].read_into, lo, master)]
        state = {}
        files = [self.master_files[gi]]
        if self.steps[gi]:
            for row, key in enumerate(self.state_keys, 1):
                state[key] = buffer[row, : hi - lo]
                futures.append(self.pool.submit(self._state_tensor(gi, key).read_into, lo, state[key]))
                files.append(self._state_tensor(gi, key))
        # the kernel reads READ_AHEAD blocks beyond this one meanwhile (each block asked once)
        n, b = self.groups[gi].numel, self.blocks[gi]
        ahead = (hi, min(n, hi + READ_AHEAD * b)) if lo == 0 else (lo + READ_AHEAD * b, min(n, hi + READ_AHEAD * b))
        for f in files:
            f.will_need(ahead[0], ahead[1] - ahead[0])
        return master, state, futures, buffer

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

    def read_ahead(self, nbytes: int) -> None:
        """Ask the kernel (from an I/O thread: a large WILLNEED may wait on the disk's queue)
        to read the first `nbytes` of what the next step reads (group by group, master and
        state together) into its page cache; the step's own reads then find them there. A
        hint only: its futures are not waited for."""
        if self.folder is None or nbytes <= 0:
            return
        for gi, g in enumerate(self.groups):
            files = [self.master_files[gi]] + ([self._state_tensor(gi, k) for k in self.state_keys]
                                               if self.steps[gi] else [])
            count = min(g.numel, nbytes // (4 * len(files)))
            for f in files:
                self.pool.submit(f.will_need, 0, count)
            nbytes -= 4 * len(files) * count
            if nbytes <= 0:
                return

    # ---- the step ----------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        # nvme: one block stepped, one read ahead when two fit, the rest written behind
        read_ahead = self.folder is None or self.buffer_count >= 2
        most_writes = self.buffer_count - 1 - read_ahead
        for gi, g in enumerate(self.groups):
            ranges = self._ranges(gi)
            writes: list[tuple[list[Future], torch.Tensor]] = []
            ahead = self._read(gi, *ranges[0])
            for b, (lo, hi) in enumerate(ranges):
                master, state_in, reads, buffer = ahead
                if b + 1 < len(ranges) and read_ahead:
                    ahead = self._read(gi, *ranges[b + 1])
                for f in reads:
                    f.result()
                # fp32 on this device already: a view, scaled in place (the strategy clears it
                # after the step anyway); otherwise a copy of one block
                grad = self._grad(g, lo, hi)
                if self.coef != 1.0:
                    grad.mul_(self.coef)
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
                if self.folder is None:
                    if not self.steps[gi]:  # first step: the optimizer made fresh state tensors
                        for key in self.state_keys:
                            self._state_tensor(gi, key)[lo:hi].copy_(state[key])
                else:
                    writes.append(([self.pool.submit(self.master_files[gi].write_from, lo, master)]
                                   + [self.pool.submit(self._state_tensor(gi, key).write_from, lo, state[key])
                                      for key in self.state_keys], buffer))
                    while len(writes) > most_writes:
                        self._written(*writes.pop(0))
                    if b + 1 < len(ranges) and not read_ahead:
                        ahead = self._read(gi, *ranges[b + 1])
                state.clear()
            for block_writes in writes:
                self._written(*block_writes)
            self.steps[gi] += 1
        self.coef = 1.0

    def _written(self, futures: list[Future], buffer: torch.Tensor) -> None:
        for f in futures:
            f.result()
        self._free.append(buffer)
        self._in_use -= 1

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Gradients belong to the strategy's shards; it clears them."""

    # ---- checkpoints and accounting ----------------------------------------------------------
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

    def load_state_dict(self, saved: dict) -> None:
        for gi, entry in saved["state"].items():
            gi = int(gi)
            self.steps[gi] = int(entry["step"])
            n = self.groups[gi].numel
            keys = [k for k in entry if k not in ("step", "blocks") and (
                k in self.state_keys or isinstance(entry[k], FileBacked)
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
        for store in [*self.master_files, *self.state_files.values()]:
            if store is not None:
                store.close()
