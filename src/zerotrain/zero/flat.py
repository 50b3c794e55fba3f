"""Flat, padded, partitionable parameter buffers: the one layout every ZeRO stage shares.

One optimizer param group becomes one contiguous buffer. Parameters are laid end to end in
reverse registration order, so the parameters whose gradients arrive first in backward sit
together and a gradient bucket is a plain slice:

    buffer  |  p_n  | p_n-1 |  ...  |  p_1  | p_0 |pad|
    shards  |    rank 0     |    rank 1     |  rank 2   |   (each `shard_numel` long)

The buffer is padded (layout.py, scheme "flat") so that every rank's shard has the same
length and starts on an aligned offset. Model parameters become views
into the buffer (`p.data = buffer[o:o+n].view(shape)`), which is what lets one collective or
one optimizer kernel touch every parameter of the group at once.

A tensor-parallel (DTensor) parameter is laid out by its local piece: its shape here is the
piece's, and the piece becomes the view (parallel/tensor/dtensor.py: rebind), so ZeRO over the
data dimension never sees the other tensor ranks' pieces.
"""

from __future__ import annotations

import torch

from ..parallel.tensor.dtensor import like, local, rebind
from .layout import FLAT, GroupLayout


class FlatGroup(GroupLayout):
    """One param group's parameters and their flat layout (offsets, sizes, shard boundaries)."""

    def __init__(self, params: list[torch.nn.Parameter], world_size: int = 1, sharded: bool = True):
        self.params = list(params)
        self.shapes = [local(p).shape for p in self.params]
        super().__init__([local(p).numel() for p in self.params], world_size, FLAT, sharded)

    def new_buffer(self, dtype: torch.dtype, device) -> torch.Tensor:
        return torch.zeros(self.padded_numel, dtype=dtype, device=device)

    def views(self, buffer: torch.Tensor) -> list[torch.Tensor]:
        """Per-parameter views of `buffer`, shaped like the parameters."""
        return [buffer[o : o + n].view(s) for o, n, s in zip(self.offsets, self.numels, self.shapes)]

    def move_params_into(self, buffer: torch.Tensor) -> None:
        """Copy every parameter into `buffer` and make its storage a view of it (init only).
        One parameter at a time, so each old storage is freed as soon as it is copied and the
        model never exists twice in memory."""
        for p, view in zip(self.params, self.views(buffer)):
            view.copy_(local(p).detach().reshape(view.shape))
            rebind(p, view)

    def bind_grads(self, buffer: torch.Tensor) -> list[torch.Tensor]:
        """Point every parameter's `.grad` at its slice of `buffer`; autograd then accumulates
        in place, so the gradients are already flat when backward ends."""
        views = self.views(buffer)
        for p, view in zip(self.params, views):
            p.grad = like(p, view)
        return views

    def shard(self, buffer: torch.Tensor, rank: int) -> torch.Tensor:
        lo, hi = self.shard_range(rank)
        return buffer[lo:hi]


class FlatModel:
    """Stages 0-2: the model's parameters as views of one compute-dtype buffer per group and,
    with `whole_grads` (stages 0-1), their gradients as views of another.

    Stages 0-1 with gradient accumulation in a wider dtype than the model's (bf16 model,
    data_types.grad_accum_dtype fp32) also keep `accumulators`: each micro-step's gradients
    are added there and cleared, and the last one's are added back before the reduction."""

    def __init__(self, groups: list[FlatGroup], dtype: torch.dtype, device, whole_grads: bool,
                 accumulation_dtype: torch.dtype | None = None):
        self.groups = groups
        self.buffers = [fg.new_buffer(dtype, device) for fg in groups]
        for fg, buf in zip(groups, self.buffers):
            fg.move_params_into(buf)
        self.grad_buffers = [fg.new_buffer(dtype, device) for fg in groups] if whole_grads else []
        self._grad_views = [fg.bind_grads(buf) for fg, buf in zip(groups, self.grad_buffers)]
        wider = whole_grads and accumulation_dtype is not None and accumulation_dtype != dtype
        self.accumulators = [fg.new_buffer(accumulation_dtype, device) for fg in groups] if wider else []

    def after_backward(self, boundary: bool, alone: bool) -> None:
        """Inside an accumulation window a micro-step's gradients go into the wide buffer; at
        the boundary of a world of one (no reduction to fold them into) they come back."""
        if not self.accumulators:
            return
        if not boundary:
            torch._foreach_add_(self.accumulators, self.grad_buffers)
            torch._foreach_zero_(self.grad_buffers)
        elif alone:
            torch._foreach_add_(self.grad_buffers, self.accumulators)

    def fold_accumulated(self, group: int, start: int, end: int) -> None:
        """Before a range of the last micro-step's gradients is reduced (or stepped, alone)."""
        if self.accumulators:
            self.grad_buffers[group][start:end].add_(self.accumulators[group][start:end])

    def zero_grad(self) -> None:
        torch._foreach_zero_(self.grad_buffers + self.accumulators)

    def rebind_grad(self, group: int, index: int, p: torch.Tensor, buckets=None) -> None:
        """(The reducer's on_grad at stages 0-1.) A final gradient that is not its view in the flat buffer (model.zero_grad() set .grad
        to None and autograd made a fresh tensor): move it back so the layout stays valid."""
        view = self._grad_views[group][index]
        if local(p.grad) is not view:
            view.copy_(local(p.grad))
            p.grad = like(p, view)

    def adopt_assigned_grads(self) -> None:
        """Gradients user code assigned to p.grad after backward (not the flat view any more)
        are copied into the buffer the step reads, and the view is given back."""
        for fg, views in zip(self.groups, self._grad_views):
            for p, view in zip(fg.params, views):
                if p.grad is not None and local(p.grad) is not view:
                    view.copy_(local(p.grad))
                    p.grad = like(p, view)

    def shards(self, buffers: list[torch.Tensor], rank: int) -> list[torch.Tensor]:
        """Rank r's shard of each group's flat buffer."""
        return [fg.shard(buf, rank) for fg, buf in zip(self.groups, buffers)]

    def memory_tensors(self) -> list[tuple[str, str, torch.Tensor]]:
        return ([("params", "device", b) for b in self.buffers]
                + [("grads", "device", g) for g in self.grad_buffers + self.accumulators])

    def publish(self, comm) -> None:
        """Stages 1-2 after a step or a load: each rank's updated shard all-gathered in place
        into the whole buffer."""
        for fg, buf in zip(self.groups, self.buffers):
            comm.all_gather(buf, fg.shard(buf, comm.rank))
