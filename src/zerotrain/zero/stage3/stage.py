"""ZeRO stage 3: parameters sharded too; each module gathers its own just in time.

Every rank keeps 1/N of every parameter (zero/layout.py, "chunked"; gather.py brings them
back whole). schedule.py's module hooks gather a module's parameters before its
forward and again before its backward, and release them after; here:

    grad ready          copy the full gradient into its bucket, free it, release the param;
                        a complete bucket is reduce-scattered into every rank's fp32 shard

Tied parameters stay whole until their last gradient arrives (autograd accumulates a leaf
once per backward), and a module called twice simply gathers twice. The optimizer steps the
fp32 shard, exactly as in stages 1 and 2. Frozen parameters (requires_grad False: a LoRA
base model, a frozen tower) are sharded and gathered the same way, in a last group of their
own that has no gradient buckets and no masters.
"""

from __future__ import annotations

import torch

from ..buckets import Bucket, BucketedReducer, plan_buckets
from .gathered_parameters import GatheredParameters, register_owner
from ..layout import cut
from .partitioned_param import make_partitioned, make_plain
from ..offload.nvme_swap import rank_folder
from ..offload.param_shard_store import IOBuffers, ParamStore
from ..offload.host_memory import Trimmer, release_freed_memory, return_large_blocks
from .gather import Gatherer, ShardedGroup
from .schedule import GatherSchedule
from ..offload.step_behind import settled
from ..strategy import ZeroStrategy


TRIM_EVERY_BUCKETS = 8  # offloaded: freed heap pages go back every this many landed buckets


class ShardedParameters(ZeroStrategy):
    stage = 3

    def __init__(self, param_groups, registration, comm, compute_dtype, device, *, module: torch.nn.Module,
                 persistence_threshold: int = 100_000, prefetch_numel: int | None = None,
                 reuse_numel: int | None = None, max_live_numel: int = 1_000_000_000, offload_param=None,
                 **kwargs):
        super().__init__(param_groups, registration, comm, compute_dtype, device, **kwargs)
        param_kind = getattr(offload_param, "device", "none") if offload_param is not None else "none"
        #: host memory is the ceiling: freed temporaries go back (offload/host_memory.py)
        self._trim = Trimmer(every=TRIM_EVERY_BUCKETS if param_kind != "none" or self.offload.enabled else 0)
        if self._trim.every:
            return_large_blocks()
        self.separate_masters = self.separate_masters or param_kind == "nvme"
        ws, rank = comm.world_size, comm.rank
        trainable = {id(p) for ps in self.ordered for p in ps}
        frozen, seen = [], set()
        for q in module.parameters():
            if id(q) not in trainable and id(q) not in seen:
                seen.add(id(q))
                frozen.append(q)
        self.claim(frozen)
        self.groups = [ShardedGroup(ps, ws) for ps in self.ordered] + ([ShardedGroup(frozen, ws)] if frozen else [])
        self.where = {id(p): (gi, i) for gi, fg in enumerate(self.groups) for i, p in enumerate(fg.params)}
        itemsize = torch.empty((), dtype=compute_dtype).element_size()
        param_bytes = itemsize * sum(fg.shard_numel for fg in self.groups)
        trained_numel = sum(fg.shard_numel for fg in self.groups[: self.trained_groups])
        self.offload.check_space(trained_numel if self.separate_masters else 0, self.optimizer_state_bytes,
                                 also=(offload_param.nvme_path if param_kind == "nvme" else None, param_bytes))
        self._space_checked = True
        io = None
        if param_kind == "nvme":  # every parameter's chunk must fit in one I/O buffer
            io = IOBuffers(int(offload_param.buffer_count), int(offload_param.buffer_size))
            names = {id(q): name for name, q in module.named_parameters(remove_duplicate=False)}
            io.check((names.get(id(p), "?"), n, c) for fg in self.groups
                     for p, n, c in zip(fg.params, fg.full_numels, fg.numels))
        folder = rank_folder(offload_param.nvme_path, rank) if param_kind == "nvme" else None
        pin = bool(getattr(offload_param, "pin_memory", False) and torch.cuda.is_available())
        self.stores = []
        for gi, fg in enumerate(self.groups):
            store = ParamStore(fg.shard_numel, compute_dtype, param_kind, device, folder, f"params.group{gi}", pin, io)
            fg.fill(store.write, rank, compute_dtype)
            self.stores.append(store)
        release_freed_memory()  # the chunks just moved out, before the gradient shards come in
        # separate masters are read from the stores (and written back to them at each step);
        # otherwise the step writes the stored shard itself
        self._make_masters([store if self.separate_masters else store.tensor
                            for store in self.stores[: self.trained_groups]])
        self._grads_zero = True  # then the first reduce-scatter can write into them directly
        persistent = {id(p) for fg in self.groups for p, n in zip(fg.params, fg.full_numels)
                      if n < persistence_threshold}
        self.gatherer = Gatherer(self.groups, self.stores, comm, persistent, self.device, compute_dtype)
        # from here on a parameter is whole only while in use (its storage is empty otherwise)
        register_owner(self.where_params(), self, module)
        self.schedule = GatherSchedule(module, self.where, self.gatherer, prefetch_numel=prefetch_numel,
                                       reuse_numel=reuse_numel, max_live_numel=max_live_numel)
        for fg in self.groups:
            for q, shape in zip(fg.params, fg.shapes):
                make_partitioned(q, self.schedule, shape)
        trained = self.groups[: self.trained_groups]
        buckets = plan_buckets(trained, max(1, self.bucket_numel // ws), self.backward_pos)
        self.reducer = BucketedReducer(trained, buckets, self._on_grad, self._launch, self._land,
                                       max_in_flight=2 if self.overlap_comm else 1)

    def build_optimizer(self, build):
        """With the masters in NVMe the step runs behind the next forward (offload/step_behind.py):
        each gather waits for its parameters' blocks."""
        optimizer = super().build_optimizer(build)
        if self.stepper is not None and self.offload.kind == "nvme":
            self.stepper.runs_behind = True
            self.behind = self.stepper.behind
            self.gatherer.ready = self.behind.wait
        return optimizer

    def begin_forward(self) -> None:
        self._trim.now()
        self.schedule.begin_forward()

    # ---- backward ------------------------------------------------------------------------
    def begin_backward(self, boundary: bool) -> None:
        self.behind.join()  # the gradient shards are the step's until it is done
        self._trim.now()
        self.schedule.begin_backward()
        self.reducer.arm()
        self.offload.before_backward(boundary)

    def _on_grad(self, group: int, index: int, p: torch.Tensor, buckets: list[int]) -> None:
        fg, ws = self.groups[group], self.comm.world_size
        b = self.reducer.buckets[buckets[0]]
        if b.data is None:
            b.data = torch.zeros(ws, b.end - b.start, dtype=self.compute_dtype, device=p.grad.device)
        chunk, at = fg.numels[index], fg.offsets[index] - b.start
        b.data[:, at : at + chunk].copy_(cut(p.grad.reshape(-1), ws))
        p.grad = None
        self.gatherer.release([p])

    def _launch(self, bucket: Bucket):
        if bucket.data is None:  # only unused parameters
            bucket.data = torch.zeros(self.comm.world_size, bucket.end - bucket.start,
                                      dtype=self.compute_dtype, device=self.device)
        self.averaging.scale_before_sum(bucket.data)
        acc = self.master_grads[bucket.group][bucket.start : bucket.end]
        if self._grads_zero and acc.dtype == self.compute_dtype and acc.device == self.device:
            bucket.out = acc  # nothing to add to yet: reduce straight into the fp32 shard
        else:
            bucket.out = torch.empty(bucket.end - bucket.start, dtype=self.compute_dtype, device=self.device)
        return self.comm.reduce_scatter(bucket.out, bucket.data.view(-1), async_op=True)

    def _land(self, bucket: Bucket) -> None:
        self._trim.tick()
        acc = self.master_grads[bucket.group][bucket.start : bucket.end]
        if bucket.out.data_ptr() == acc.data_ptr():
            self.averaging.scale_after_sum(acc)
        else:
            self.averaging.add_sum_into(acc, bucket.out)
        bucket.out = None

    def end_backward(self) -> None:
        self.reducer.finish()
        self._grads_zero = False
        self.schedule.end_backward()
        self.gatherer.release_all()

    # ---- step ----------------------------------------------------------------------------
    def reduced_grads(self) -> list[torch.Tensor]:
        return self.master_grads

    def after_step(self) -> None:
        # separate masters were written into the stores block by block
        self.gatherer.release_all(force=True)  # persistent params must be gathered fresh
        self.behind.then(self.zero_grad)

    @settled
    def zero_grad(self) -> None:
        torch._foreach_zero_(self.master_grads)
        self._grads_zero = True

    # ---- whole access ----------------------------------------------------------------------
    def where_params(self) -> list:
        return [p for fg in self.groups for p in fg.params]

    @settled
    def write_back(self, own: dict[int, list[int]], src: int) -> None:
        """After a modification under GatheredParameters: rank `src`'s whole values become
        every rank's chunk (and fp32 master)."""
        ws, rank = self.comm.world_size, self.comm.rank
        for gi, indices in own.items():
            fg = self.groups[gi]
            for i in indices:
                p = fg.params[i]
                self.comm.broadcast(p.data, src=src)
                at = fg.offsets[i]
                mine = cut(p.data.reshape(-1), ws)[rank]
                self.stores[gi].write(at, mine)
                if self.stepper is not None and gi < self.trained_groups:
                    self.stepper.write_master(gi, at, mine)

    @settled
    def full_state_dict(self, module: torch.nn.Module) -> dict:
        """The module's state dict with every parameter whole (a collective: all ranks call)."""
        with GatheredParameters(self.where_params()):
            return {k: v.clone() for k, v in module.state_dict().items()}

    @settled
    def state_entries(self, module: torch.nn.Module) -> list:
        """One parameter whole at a time: each sharded tensor is gathered by its own fetch and
        released after it, so a model larger than one rank's memory can be written out. Every
        rank calls every fetch, in order (each is a collective)."""
        sharded = set(self.where)

        def fetch(t: torch.Tensor) -> torch.Tensor:
            if id(t) not in sharded:
                return t.detach()
            with GatheredParameters([t]):
                return t.data.clone()

        return [(k, tuple(v.shape), v.dtype, lambda v=v: fetch(v)) for k, v in module.state_dict(keep_vars=True).items()]

    def release_gathered(self) -> None:
        self.gatherer.release_all(force=True)

    # ---- checkpoints ---------------------------------------------------------------------
    def sharded_param_ids(self) -> set[int]:
        return set(self.where)

    @settled
    def memory_tensors(self) -> list[tuple[str, str, torch.Tensor | int]]:
        # whole parameters may share one mapping (pages.py): their own bytes, not its size
        whole = sum(p.numel() * p.element_size() for p in self.gatherer.whole.values())
        return ([("params", s.place, s.tensor) for s in self.stores if s.tensor is not None]
                + [("params", "device", whole)] + self.master_tensors())

    def nvme_bytes(self) -> dict[str, int]:
        return dict(super().nvme_bytes(), params=sum(s.nvme_bytes for s in self.stores))

    @settled
    def close(self) -> None:
        """Remove hooks and swap files (engine.destroy). The parameters stay released."""
        super().close()
        self.schedule.close()
        for store in self.stores:
            store.close()

    @settled
    def detach_model(self) -> None:
        """Every parameter whole again in storage of its own, a plain nn.Parameter, no hooks (a
        collective: a later initialize on the same model calls it on every rank)."""
        self.gatherer.release_all(force=True)
        for gi, fg in enumerate(self.groups):
            self.gatherer.gather({gi: list(range(len(fg.params)))})
            whole = [q.data.clone() for q in fg.params]
            self.gatherer.release(fg.params, force=True)  # their page slots; the clones stay
            for q, value in zip(fg.params, whole):
                q.data = value
                make_plain(q)
        super().detach_model()

    @settled
    def state_dict(self) -> dict:
        state = {"shards": [s.full() for s in self.stores], **super().state_dict()}
        if "masters" in state:  # one entry per layout group; a frozen group has no master
            state["masters"] += [None] * (len(self.groups) - self.trained_groups)
        return state

    @settled
    def load_state_dict(self, state: dict) -> None:
        if "shards" in state:
            for store, shard in zip(self.stores, state["shards"]):
                store.load(shard)
        self.load_masters(state)
        self.gatherer.release_all(force=True)
