"""Flat, padded, partitionable parameter buffers: the one layout every ZeRO stage shares.

One optimizer param group becomes one contiguous buffer. Parameters are laid end to end in
reverse registration order, so the parameters whose gradients arrive first in backward sit
together and a gradient bucket is a plain slice:

    buffer  |  p_n  | p_n-1 |  ...  |  p_1  | p_0 |pad|
    shards  |    rank 0     |    rank 1     |  rank 2   |   (each `shard_numel` long)

The buffer is padded to a multiple of `world_size * ALIGN` elements so that every rank's
shard has the same length and starts on an aligned offset. Model parameters become views
into the buffer (`p.data = buffer[o:o+n].view(shape)`), which is what lets one collective or
one optimizer kernel touch every parameter of the group at once.
"""

from __future__ import annotations

import torch

ALIGN = 16  # elements; keeps shard starts 64-byte aligned in fp32


class FlatGroup:
    """The layout of one param group: offsets, sizes and shard boundaries."""

    def __init__(self, params: list[torch.nn.Parameter], world_size: int = 1):
        self.params = list(params)
        self.shapes = [p.shape for p in self.params]
        self.numels = [p.numel() for p in self.params]
        self.offsets = []
        total = 0
        for n in self.numels:
            self.offsets.append(total)
            total += n
        self.numel = total
        unit = world_size * ALIGN
        self.padded_numel = max(unit, -(-total // unit) * unit)
        self.world_size = world_size
        self.shard_numel = self.padded_numel // world_size

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
            view.copy_(p.detach().reshape(view.shape))
            p.data = view

    def bind_grads(self, buffer: torch.Tensor) -> list[torch.Tensor]:
        """Point every parameter's `.grad` at its slice of `buffer`; autograd then accumulates
        in place, so the gradients are already flat when backward ends."""
        views = self.views(buffer)
        for p, view in zip(self.params, views):
            p.grad = view
        return views

    def shard(self, buffer: torch.Tensor, rank: int) -> torch.Tensor:
        return buffer[rank * self.shard_numel : (rank + 1) * self.shard_numel]
