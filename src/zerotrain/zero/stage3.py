"""ZeRO stage 3: parameters sharded too; each module gathers its own just in time.

Every rank keeps 1/N of every parameter (stage3_gather.py). Hooks on each module that owns
parameters run the schedule:

    forward pre-hook    all-gather the module's parameters (one collective per contiguous run)
    forward post-hook   release them (unless small enough to persist, needed again by backward
                        within stage3_max_reuse_distance, or we are in backward, where
                        activation-checkpoint recomputation runs forwards again)
    output grad hook    all-gather them again for the module's backward
    grad ready          copy the full gradient into its bucket, free it, release the param;
                        a complete bucket is reduce-scattered into every rank's fp32 shard

Tied parameters stay whole until their last gradient arrives (autograd accumulates a leaf
once per backward), and a module called twice simply gathers twice. The optimizer steps the
fp32 shard, exactly as in stages 1 and 2.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_leaves

from .buckets import Bucket, BucketedReducer, plan_buckets
from .stage3_gather import Gatherer, ShardedGroup
from .nvme_swap import rank_folder
from .offload_placement import OptimizerOffload
from .param_shard_store import ParamStore
from .gathered_parameters import GatheredParameters, register_owner
from .stage0 import attach_and_scale, plan_averaging
from .stage1 import sharded_grad_norm

# what a module may return besides tensors and still be seen through for gradient hooks
_TRANSPARENT = (torch.Tensor, int, float, bool, str, type(None))


class ShardedParameters:
    stage = 3

    def __init__(self, param_groups: list[dict], registration: dict[int, int], comm, compute_dtype, device,
                 *, module: torch.nn.Module, bucket_numel: int, prescale_gradients: bool = False,
                 gradient_predivide_factor: float = 1.0, overlap_comm: bool = True,
                 persistence_threshold: int = 100_000, prefetch_numel: int | None = None,
                 reuse_numel: int | None = None,
                 max_live_numel: int = 1_000_000_000, offload_optimizer=None, offload_param=None,
                 offload_block_numel: int = 1 << 22):
        self.comm = comm
        self.compute_dtype = compute_dtype
        self.mixed = compute_dtype != torch.float32
        self.offload = OptimizerOffload(offload_optimizer, comm.rank, device, offload_block_numel)
        param_kind = getattr(offload_param, "device", "none") if offload_param is not None else "none"
        self.separate_masters = (self.mixed or param_kind == "nvme"
                                 or self.offload.master_device != torch.device(device))
        self.device = torch.device(device)
        self.averaging = plan_averaging(comm.world_size, prescale_gradients, float(gradient_predivide_factor),
                                        compute_dtype)
        ws, rank = comm.world_size, comm.rank
        self.groups, self.hyper = [], []
        for g in param_groups:
            self.groups.append(ShardedGroup(sorted(g["params"], key=lambda p: -registration[id(p)]), ws))
            self.hyper.append({k: v for k, v in g.items() if k != "params"})
        self.where = {id(p): (gi, i) for gi, fg in enumerate(self.groups) for i, p in enumerate(fg.params)}
        folder = rank_folder(offload_param.nvme_path, rank) if param_kind == "nvme" else None
        pin = bool(getattr(offload_param, "pin_memory", False) and torch.cuda.is_available())
        self.stores, self.masters = [], []
        for gi, fg in enumerate(self.groups):
            shard = fg.build_shard(rank, compute_dtype, device)
            store = ParamStore(shard, param_kind, device, folder, f"params.group{gi}", pin)
            if self.separate_masters:
                master = self.offload.new_master(shard)
            else:  # the shard itself: the step writes the parameters directly
                master = torch.nn.Parameter(store.tensor)
                master.grad = torch.zeros_like(store.tensor)
            self.stores.append(store)
            self.masters.append(master)
        self.master_grads = [m.grad for m in self.masters]  # survives optimizer.zero_grad()
        self._grads_zero = True  # then the first reduce-scatter can write into them directly
        persistent = {id(p) for fg in self.groups for p, n in zip(fg.params, fg.full_numels)
                      if n < persistence_threshold}
        self.gatherer = Gatherer(self.groups, self.stores, comm, persistent, self.device, compute_dtype)
        # from here on a parameter is whole only while in use (its storage is empty otherwise)
        register_owner(self.where_params(), self)
        self.in_backward = False
        self.prefetch_numel = prefetch_numel
        self.max_live_numel = max_live_numel
        self.reuse_numel = reuse_numel
        self._kept_after_forward: list[bool] = []  # per position of the forward trace
        self.owners: list[dict[int, list[int]]] = []  # per module that owns params: {group: [index]}
        self.owner_params: list[list] = []
        self._traces = {False: [], True: []}  # last pass's module order (forward, backward)
        self._now = {False: [], True: []}
        self._hooks = self._register_module_hooks(module)
        self.owner_numel = [sum(self.gatherer.numel_of[id(p)] for p in ps) for ps in self.owner_params]
        if self.prefetch_numel is None:
            # about two typical modules ahead; sized by the largest (often the embedding) the
            # window held several layers gathered at once
            sizes = sorted(self.owner_numel)
            self.prefetch_numel = 2 * sizes[len(sizes) // 2] if sizes else 0
        if self.reuse_numel is None:  # what prefetch would bring straight back is not released
            self.reuse_numel = self.prefetch_numel
        backward_pos = {id(p): -registration[id(p)] for fg in self.groups for p in fg.params}
        buckets = plan_buckets(self.groups, max(1, bucket_numel // ws), backward_pos)
        self.reducer = BucketedReducer(self.groups, buckets, self._on_grad, self._launch, self._land,
                                       max_in_flight=2 if overlap_comm else 1)

    # ---- gather / release around each module -------------------------------------------
    def _register_module_hooks(self, module: torch.nn.Module) -> list:
        handles = []
        for m in module.modules():
            own, params = {}, []
            for p in m.parameters(recurse=False):
                if id(p) in self.where:
                    gi, i = self.where[id(p)]
                    own.setdefault(gi, []).append(i)
                    params.append(p)
            if not own:
                continue
            k = len(self.owners)
            self.owners.append(own)
            self.owner_params.append(params)
            handles += [
                m.register_forward_pre_hook(lambda *_, k=k: self._before(k, backward=False)),
                m.register_forward_hook(lambda _m, _args, output, k=k: self._after_forward(k, output)),
            ]
            # No release after a module's backward: autograd accumulates a parameter's gradient
            # after that, and accumulating needs the parameter whole; _on_grad releases it.
        return handles

    def _new_pass(self, backward: bool) -> None:
        if self._now[backward]:
            self._traces[backward] = self._now[backward]
            self._plan_reuse()
        self._now[backward] = []

    def _plan_reuse(self) -> None:
        """stage3_max_reuse_distance: a module whose next use (in backward) comes within that
        many gathered elements stays whole after its forward. The last modules of forward are
        the first of backward; releasing them only to gather them again at once (the tied
        embedding of a GPT) freed and reallocated them at the activation peak."""
        forward, backward = self._traces[False], self._traces[True]
        first_use, gathered = {}, 0
        for k in backward:
            first_use.setdefault(k, gathered)
            gathered += self.owner_numel[k]
        keep, gathered = [], 0
        for k in reversed(forward):
            keep.append(k in first_use and gathered + first_use[k] <= self.reuse_numel)
            gathered += self.owner_numel[k]
        self._kept_after_forward = keep[::-1]

    def _before(self, k: int, backward: bool) -> None:
        """Gather module k, then prefetch the modules the last pass ran next, within the
        prefetch bucket and the live-parameter budget. Every rank runs the same modules in
        the same order, so the prefetch collectives line up across ranks."""
        position = len(self._now[backward])
        self._now[backward].append(k)
        self.gatherer.gather(self.owners[k])
        trace = self._traces[backward]
        if not self.prefetch_numel or position >= len(trace) or trace[position] != k:
            return
        window = 0  # elements of the modules ahead, whether already whole, arriving or not
        for following in trace[position + 1 :]:
            window += self.owner_numel[following]
            if window > self.prefetch_numel:
                break
            need = self.gatherer.missing_numel(self.owners[following])
            if need and self.gatherer.live_numel + need > self.max_live_numel:
                break
            if need:
                self.gatherer.start(self.owners[following])

    def _after_forward(self, k: int, output) -> None:
        """Release module k, and arrange for backward to gather it again: a hook on the
        gradient of each output that needs one, which arrives just before the module's own
        backward. (A full backward pre-hook would do the same, but its extra autograd node
        around every module kept about 50 MB more heap at the peak of a 20M-parameter GPT.)"""
        leaves = tree_leaves(output) if torch.is_grad_enabled() else []  # no backward to come
        if any(not isinstance(x, _TRANSPARENT) for x in leaves):
            return  # an output we cannot look into: stay whole until backward ends
        outputs = [x for x in leaves if isinstance(x, torch.Tensor) and x.requires_grad]
        if outputs:
            fired = []  # once per call, whatever the number of outputs

            def gather_for_backward(grad, k=k, fired=fired):
                if not fired:
                    fired.append(True)
                    self._before(k, backward=True)

            for x in outputs:
                x.register_hook(gather_for_backward)
        if self.in_backward:  # activation-checkpoint recomputation keeps them for backward
            return
        position = len(self._now[False]) - 1
        trace = self._traces[False]
        if (position < len(self._kept_after_forward) and trace[position] == k and self._kept_after_forward[position]
                and self.gatherer.live_numel <= self.max_live_numel):  # within stage3_max_live_parameters
            return
        self.gatherer.release(self.owner_params[k])

    def begin_forward(self) -> None:
        self._new_pass(backward=False)

    # ---- backward ------------------------------------------------------------------------
    def optimizer_groups(self) -> list[dict]:
        return [dict(h, params=[m]) for h, m in zip(self.hyper, self.masters)]

    def build_optimizer(self, build):
        return self.offload.build_optimizer(build, self.optimizer_groups())

    def begin_backward(self, boundary: bool) -> None:
        self.in_backward = True
        self._new_pass(backward=True)
        self.reducer.arm()

    def _on_grad(self, group: int, index: int, p: torch.Tensor, buckets: list[int]) -> None:
        fg, ws = self.groups[group], self.comm.world_size
        b = self.reducer.buckets[buckets[0]]
        if b.data is None:
            b.data = torch.zeros(ws, b.end - b.start, dtype=self.compute_dtype, device=p.grad.device)
        chunk, at = fg.numels[index], fg.offsets[index] - b.start
        grad = p.grad.reshape(-1)
        if grad.numel() != ws * chunk:
            grad = F.pad(grad, (0, ws * chunk - grad.numel()))
        b.data[:, at : at + chunk].copy_(grad.view(ws, chunk))
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
        acc = self.master_grads[bucket.group][bucket.start : bucket.end]
        if bucket.out.data_ptr() == acc.data_ptr():
            self.averaging.scale_after_sum(acc)
        else:
            self.averaging.add_sum_into(acc, bucket.out)
        bucket.out = None

    def end_backward(self) -> None:
        self.reducer.finish()
        self._grads_zero = False
        self.in_backward = False
        self.gatherer.release_all()

    # ---- step ----------------------------------------------------------------------------
    def grad_norm(self, loss_scale: float = 1.0) -> float:
        return sharded_grad_norm(self.master_grads, self.comm, loss_scale)

    def prepare_step(self, coef: float) -> None:
        attach_and_scale(self.masters, self.master_grads, coef)

    def after_step(self) -> None:
        if self.separate_masters:
            for store, master in zip(self.stores, self.masters):
                store.write(0, master.detach())
        self.gatherer.release_all(force=True)  # persistent params must be gathered fresh
        self.zero_grad()

    def zero_grad(self) -> None:
        torch._foreach_zero_(self.master_grads)
        self._grads_zero = True

    # ---- whole access ----------------------------------------------------------------------
    def where_params(self) -> list:
        return [p for fg in self.groups for p in fg.params]

    def write_back(self, own: dict[int, list[int]], src: int) -> None:
        """After a modification under GatheredParameters: rank `src`'s whole values become
        every rank's chunk (and fp32 master)."""
        ws, rank = self.comm.world_size, self.comm.rank
        for gi, indices in own.items():
            fg = self.groups[gi]
            for i in indices:
                p = fg.params[i]
                self.comm.broadcast(p.data, src=src)
                chunk, at = fg.numels[i], fg.offsets[i]
                flat = F.pad(p.data.reshape(-1), (0, ws * chunk - fg.full_numels[i]))
                mine = flat[rank * chunk : (rank + 1) * chunk]
                self.stores[gi].write(at, mine)
                if self.separate_masters:
                    self.masters[gi].data[at : at + chunk].copy_(mine)

    def full_state_dict(self, module: torch.nn.Module) -> dict:
        """The module's state dict with every parameter whole (a collective: all ranks call)."""
        with GatheredParameters(self.where_params()):
            return {k: v.clone() for k, v in module.state_dict().items()}

    # ---- checkpoints ---------------------------------------------------------------------
    def sharded_param_ids(self) -> set[int]:
        return set(self.where)

    def memory_tensors(self) -> list[tuple[str, str, torch.Tensor | int]]:
        # whole parameters may share one mapping (pages.py): their own bytes, not its size
        whole = sum(p.numel() * p.element_size() for p in self.gatherer.whole.values())
        host = self.offload.place
        return ([("params", s.place, s.tensor) for s in self.stores if s.tensor is not None]
                + [("params", "device", whole)]
                + [("grads", host, g) for g in self.master_grads]
                + [("master_params", host, m) for m in self.masters])

    def nvme_bytes(self) -> dict[str, int]:
        return dict(self.offload.nvme_bytes(), params=sum(s.nvme_bytes for s in self.stores))

    def close(self) -> None:
        """Remove hooks and swap files (engine.destroy). The parameters stay released."""
        self.reducer.remove()
        for handle in self._hooks:
            handle.remove()
        self.offload.close()
        for store in self.stores:
            store.close()

    def layout(self, names: dict[int, str]) -> dict:
        """Chunked layout: parameter i of a group is rank r's [offsets[i], offsets[i] + numels[i])
        for r = 0..N-1 concatenated, cut to full_numels[i]."""
        return {"scheme": "chunked", "stage": 3, "world_size": self.comm.world_size, "groups": [
            {"names": [names[id(p)] for p in fg.params], "shapes": [list(s) for s in fg.shapes],
             "offsets": fg.offsets, "numels": fg.numels, "full_numels": fg.full_numels,
             "shard_numel": fg.shard_numel}
            for fg in self.groups]}

    def state_dict(self) -> dict:
        state = {"shards": [s.full() for s in self.stores]}
        if self.separate_masters:
            state["masters"] = [m.detach().clone() for m in self.masters]
        return state

    def load_state_dict(self, state: dict) -> None:
        for i, store in enumerate(self.stores):
            if "shards" in state:
                store.write(0, state["shards"][i])
            if self.separate_masters:
                self.masters[i].data.copy_(state["masters"][i] if "masters" in state else store.full())
        self.gatherer.release_all(force=True)
