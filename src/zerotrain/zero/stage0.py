"""ZeRO stage 0: plain data parallelism over flat buffers; the base the other stages extend.

Every rank holds the whole model, its gradients and optimizer state. Gradients are averaged
with bucketed all-reduces launched during backward (buckets.py). The optimizer steps one
flat fp32 tensor per param group:

    fp32 training:   model params == master (views into one buffer), grads are views too,
                     so the step touches no copies at all.
    fp16/bf16:       model params and grads live in a half-precision buffer; an fp32 master
                     buffer is what the optimizer steps, and is cast back after each step.

Stages 1 and 2 keep this skeleton and override what is sharded: the masters (one shard per
rank), where a reduced bucket goes (`_launch`, `_land`), and `after_step` (all-gather).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..comm import Comm
from ..config.zero import DEFAULT_BUCKET_NUMEL
from .buckets import Bucket, BucketedReducer, plan_buckets
from .flat import FlatGroup
from .offload_placement import OptimizerOffload



@dataclass(frozen=True)
class Averaging:
    """Where a gradient mean's division by the world size happens: `in_loss` is folded into
    the loss the engine back-propagates (free: no pass over the gradients), `before` scales a
    bucket ahead of the sum, `after` the sum."""

    in_loss: float = 1.0
    before: float = 1.0
    after: float = 1.0

    def scale_before_sum(self, grads: torch.Tensor) -> None:
        if self.before != 1.0:
            grads.mul_(self.before)

    def scale_after_sum(self, grads: torch.Tensor) -> None:
        if self.after != 1.0:
            grads.mul_(self.after)

    def add_sum_into(self, acc: torch.Tensor, summed: torch.Tensor) -> None:
        """acc += the scaled sum. The copy to acc's device blocks: an offloaded acc is read by
        the CPU at once, and an asynchronous copy out of a GPU could still be in flight."""
        acc.add_(summed.to(acc.device), alpha=self.after)


def plan_averaging(world_size: int, prescale: bool, predivide: float, dtype: torch.dtype) -> Averaging:
    """fp16: where the spec says (prescale_gradients, gradient_predivide_factor), for that
    choice guards its narrow range. fp32 and bf16 have range to spare, so the whole 1/N goes
    into the loss: no pass over the gradients for it, and for a power-of-two world size the
    very numbers that dividing after the sum gives."""
    if dtype != torch.float16:
        return Averaging(in_loss=1.0 / world_size)
    if prescale:
        return Averaging(before=1.0 / world_size)
    return Averaging(before=1.0 / predivide, after=predivide / world_size)


def attach_and_scale(masters: list[torch.Tensor], grads: list[torch.Tensor], coef: float) -> None:
    """Give each master its gradient again (a user's optimizer.zero_grad() may have set it to
    None) and multiply all of them by coef (1/loss scale x clip) in one foreach kernel."""
    for master, grad in zip(masters, grads):
        master.grad = grad
    if coef != 1.0:
        torch._foreach_mul_(grads, coef)


class DataParallel:
    stage = 0
    split_buckets_at_shards = False

    def __init__(self, param_groups: list[dict], registration: dict[int, int], comm: Comm,
                 compute_dtype: torch.dtype, device, bucket_numel: int = DEFAULT_BUCKET_NUMEL,
                 prescale_gradients: bool = False, gradient_predivide_factor: float = 1.0,
                 overlap_comm: bool = True, offload_optimizer=None, offload_block_numel: int = 1 << 22):
        self.comm = comm
        self.compute_dtype = compute_dtype
        self.mixed = compute_dtype != torch.float32
        self.offload = OptimizerOffload(offload_optimizer, comm.rank, device, offload_block_numel)
        # fp32 masters are separate tensors when the model computes in half precision or when
        # they live on another device (offloaded from a GPU); otherwise they are the model's
        # own buffer
        self.separate_masters = self.mixed or self.offload.master_device != torch.device(device)
        self.averaging = plan_averaging(comm.world_size, prescale_gradients, float(gradient_predivide_factor),
                                        compute_dtype)
        self.overlap_comm = overlap_comm
        ws = comm.world_size
        self.groups: list[FlatGroup] = []
        self.hyper: list[dict] = []
        for g in param_groups:
            params = sorted(g["params"], key=lambda p: -registration[id(p)])
            self.groups.append(FlatGroup(params, ws))
            self.hyper.append({k: v for k, v in g.items() if k != "params"})
        self.model_buffers = [fg.new_buffer(compute_dtype, device) for fg in self.groups]
        for fg, buf in zip(self.groups, self.model_buffers):
            fg.move_params_into(buf)
        self.grad_buffers = self._make_grad_buffers(device)
        self._grad_views = [fg.bind_grads(buf) for fg, buf in zip(self.groups, self.grad_buffers)]
        self.masters = self._make_masters()
        # kept apart from .grad: a user's optimizer.zero_grad() may set master.grad to None
        self.master_grads = [m.grad for m in self.masters]
        backward_pos = {id(p): -registration[id(p)] for fg in self.groups for p in fg.params}
        buckets = plan_buckets(self.groups, bucket_numel, backward_pos, self.split_buckets_at_shards)
        self.reducer = BucketedReducer(self.groups, buckets, self._on_grad, self._launch, self._land,
                                       max_in_flight=None if overlap_comm else 1)

    # ---- layout --------------------------------------------------------------------------
    def _make_grad_buffers(self, device) -> list[torch.Tensor]:
        return [fg.new_buffer(self.compute_dtype, device) for fg in self.groups]

    def _make_masters(self) -> list[torch.nn.Parameter]:
        masters = []
        for model_buf, grad_buf in zip(self.model_buffers, self.grad_buffers):
            if self.separate_masters:
                master = self.offload.new_master(model_buf)
            else:  # shares storage with the model: the step writes the model directly
                master = torch.nn.Parameter(model_buf)
                master.grad = grad_buf
            masters.append(master)
        return masters

    def build_optimizer(self, build):
        """`build(param_groups) -> torch optimizer`; offload may wrap it (state on NVMe)."""
        return self.offload.build_optimizer(build, self.optimizer_groups())

    def optimizer_groups(self) -> list[dict]:
        return [dict(h, params=[m]) for h, m in zip(self.hyper, self.masters)]

    # ---- forward / backward ----------------------------------------------------------------
    def begin_forward(self) -> None:
        """Nothing to prepare: every parameter is whole at stages 0-2."""

    def begin_backward(self, boundary: bool) -> None:
        if boundary and not self.comm.alone:
            self.reducer.arm()

    def _on_grad(self, group: int, index: int, p: torch.Tensor, buckets: list[int]) -> None:
        view = self._grad_views[group][index]
        if p.grad is not view:
            # .grad was set to None (model.zero_grad()) and autograd made a fresh tensor:
            # move it back into the flat buffer so the layout stays valid.
            view.copy_(p.grad)
            p.grad = view

    def _launch(self, bucket: Bucket):
        bucket.data = self.grad_buffers[bucket.group][bucket.start : bucket.end]
        self.averaging.scale_before_sum(bucket.data)
        return self.comm.all_reduce(bucket.data, async_op=True)

    def _land(self, bucket: Bucket) -> None:
        self.averaging.scale_after_sum(bucket.data)

    def end_backward(self) -> None:
        self.reducer.finish()

    # ---- step ----------------------------------------------------------------------------
    def _step_grads(self) -> list[torch.Tensor]:
        """The reduced gradients this rank's optimizer step reads (before unscaling)."""
        return self.grad_buffers

    def grad_norm(self, loss_scale: float = 1.0) -> float:
        """Global L2 norm of the averaged, unscaled gradients (inf/nan on overflow)."""
        norms = torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32) for g in self._step_grads()])
        return float(torch.linalg.vector_norm(norms)) / loss_scale

    def prepare_step(self, coef: float) -> None:
        """Bring gradients into the master grads, multiplied by coef (unscale x clip)."""
        if self.separate_masters:
            torch._foreach_copy_(self.master_grads, self._step_grads())
        attach_and_scale(self.masters, self.master_grads, coef)

    def after_step(self) -> None:
        if self.separate_masters:
            for model_buf, master in zip(self.model_buffers, self.masters):
                model_buf.copy_(master.detach())
        self.zero_grad()

    def zero_grad(self) -> None:
        torch._foreach_zero_(self.grad_buffers)

    # ---- accounting ----------------------------------------------------------------------
    def memory_tensors(self) -> list[tuple[str, str, torch.Tensor]]:
        """(category, place, tensor) for everything this strategy holds; aliases are removed
        by whoever sums them (engine.memory_breakdown counts each storage once). A byte count
        may stand in for a tensor whose storage is not its own (stage 3's whole params)."""
        host = self.offload.place
        return ([("params", "device", b) for b in self.model_buffers]
                + [("grads", "device", g) for g in self.grad_buffers]
                + [("grads", host, g) for g in self.master_grads]
                + [("master_params", host, m) for m in self.masters])

    def nvme_bytes(self) -> dict[str, int]:
        return self.offload.nvme_bytes()

    def close(self) -> None:
        """Remove hooks and swap files (engine.destroy)."""
        self.reducer.remove()
        self.offload.close()

    # ---- checkpoints ---------------------------------------------------------------------
    def layout(self, names: dict[int, str]) -> dict:
        """Where each parameter sits in the saved shards, so `zerotrain consolidate` can put
        whole fp32 weights back together from any stage."""
        return {"scheme": "flat", "stage": self.stage, "world_size": self.comm.world_size, "groups": [
            {"names": [names[id(p)] for p in fg.params], "shapes": [list(s) for s in fg.shapes],
             "offsets": fg.offsets, "numels": fg.numels, "shard_numel": fg.shard_numel}
            for fg in self.groups]}

    def state_dict(self) -> dict:
        """This rank's share of what the module state dict does not hold (fp32 masters)."""
        return {"masters": [m.detach().clone() for m in self.masters]} if self.separate_masters else {}

    def load_state_dict(self, state: dict) -> None:
        """Call after the module's weights were loaded; masters come from `state` if saved."""
        if not self.separate_masters:
            return
        saved = state.get("masters")
        for i, (master, model_buf) in enumerate(zip(self.masters, self.model_buffers)):
            master.data.copy_(saved[i] if saved is not None else model_buf)
            model_buf.copy_(master.detach())
