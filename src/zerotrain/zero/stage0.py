"""ZeRO stage 0: plain data parallelism over flat buffers.

Every rank holds the whole model, its gradients and optimizer state. Gradients are averaged
with bucketed all-reduces launched during backward (see buckets.py). The optimizer steps one
flat fp32 tensor per param group:

    fp32 training:   model params == master (views into one buffer), grads are views too,
                     so the step touches no copies at all.
    fp16/bf16:       model params and grads live in a half-precision buffer; an fp32 master
                     buffer is what the optimizer steps, and is cast back after each step.

Later stages keep this skeleton and change what is sharded: they override the reduction
(`_launch`), what the optimizer sees (`optimizer_groups`) and `after_step`.
"""

from __future__ import annotations

import torch

from ..dist import Comm
from .buckets import Bucket, BucketedReducer
from .flat import FlatGroup

# DDP's default first-class bucket (25 MB of fp32): big enough to amortise a collective,
# small enough to overlap with backward. DeepSpeed's 5e8 default would mean one bucket.
DEFAULT_BUCKET_NUMEL = 25 * 2**20 // 4


class DataParallel:
    stage = 0

    def __init__(self, param_groups: list[dict], registration: dict[int, int], comm: Comm,
                 compute_dtype: torch.dtype, device, bucket_numel: int = DEFAULT_BUCKET_NUMEL,
                 prescale_gradients: bool = False, gradient_predivide_factor: float = 1.0):
        self.comm = comm
        self.compute_dtype = compute_dtype
        self.mixed = compute_dtype != torch.float32
        self.prescale = prescale_gradients
        self.predivide = float(gradient_predivide_factor)
        ws = comm.world_size
        self.groups: list[FlatGroup] = []
        self.hyper: list[dict] = []
        for g in param_groups:
            params = sorted(g["params"], key=lambda p: -registration[id(p)])
            self.groups.append(FlatGroup(params, ws))
            self.hyper.append({k: v for k, v in g.items() if k != "params"})
        self.model_buffers = [fg.new_buffer(compute_dtype, device, fill_from_params=True) for fg in self.groups]
        for fg, buf in zip(self.groups, self.model_buffers):
            fg.bind_params(buf)
        self.grad_buffers = [fg.new_buffer(compute_dtype, device) for fg in self.groups]
        for fg, buf in zip(self.groups, self.grad_buffers):
            fg.bind_grads(buf)
        self.masters = self._make_masters()
        backward_pos = {id(p): -registration[id(p)] for fg in self.groups for p in fg.params}
        self.reducer = BucketedReducer(self.groups, self.grad_buffers, bucket_numel, backward_pos,
                                       self._launch)

    # ---- what the optimizer steps -------------------------------------------------------
    def _make_masters(self) -> list[torch.nn.Parameter]:
        masters = []
        for model_buf, grad_buf in zip(self.model_buffers, self.grad_buffers):
            if self.mixed:
                master = torch.nn.Parameter(model_buf.float())
                master.grad = torch.zeros_like(master)
            else:  # shares storage with the model: the step writes the model directly
                master = torch.nn.Parameter(model_buf)
                master.grad = grad_buf
            masters.append(master)
        return masters

    def optimizer_groups(self) -> list[dict]:
        return [dict(h, params=[m]) for h, m in zip(self.hyper, self.masters)]

    # ---- backward ----------------------------------------------------------------------
    def begin_backward(self, boundary: bool) -> None:
        if boundary and not self.comm.alone:
            self.reducer.arm()

    def _launch(self, bucket: Bucket, grads: torch.Tensor):
        ws, f = self.comm.world_size, self.predivide
        if self.prescale:
            grads.mul_(1.0 / ws)
        elif f != 1.0:
            grads.mul_(1.0 / f)
        return self.comm.all_reduce(grads, async_op=True)

    def end_backward(self) -> None:
        if not self.reducer._armed:
            return
        self.reducer.finish()
        ws, f = self.comm.world_size, self.predivide
        if not self.prescale and f != ws:
            torch._foreach_mul_(self.grad_buffers, f / ws)

    # ---- step --------------------------------------------------------------------------
    def grad_norm(self, loss_scale: float = 1.0) -> float:
        """Global L2 norm of the averaged, unscaled gradients (inf/nan on overflow)."""
        norms = [torch.linalg.vector_norm(g, dtype=torch.float32) for g in self.grad_buffers]
        return float(torch.linalg.vector_norm(torch.stack(norms))) / loss_scale

    def prepare_step(self, coef: float) -> None:
        """Bring gradients into the master grads, multiplied by coef (unscale x clip)."""
        if self.mixed:
            for master, grads in zip(self.masters, self.grad_buffers):
                master.grad.copy_(grads)
            if coef != 1.0:
                torch._foreach_mul_([m.grad for m in self.masters], coef)
        elif coef != 1.0:
            torch._foreach_mul_(self.grad_buffers, coef)

    def after_step(self) -> None:
        if self.mixed:
            for model_buf, master in zip(self.model_buffers, self.masters):
                model_buf.copy_(master.detach())
        self.zero_grad()

    def zero_grad(self) -> None:
        torch._foreach_zero_(self.grad_buffers)

    # ---- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This rank's share of what the module state dict does not hold (fp32 masters)."""
        return {"masters": [m.detach().clone() for m in self.masters]} if self.mixed else {}

    def load_state_dict(self, state: dict) -> None:
        """Call after the module's weights were loaded; masters come from `state` if saved."""
        if not self.mixed:
            return
        saved = state.get("masters")
        for i, (master, model_buf) in enumerate(zip(self.masters, self.model_buffers)):
            master.data.copy_(saved[i] if saved is not None else model_buf)
            model_buf.copy_(master.detach())
