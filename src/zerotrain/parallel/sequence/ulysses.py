"""Ulysses attention: each rank holds 1/S of the sequence outside attention and 1/S of the
heads inside it, so the core attention sees whole sequences.

    q, k, v  (batch, heads, T/S, d)   this rank's positions, every head
        | all-to-all: scatter heads, gather the sequence
    q, k, v  (batch, heads/S, T, d)   every position, this rank's heads
        | core attention (causal over the whole sequence)
    y        (batch, heads/S, T, d)
        | all-to-all: scatter the sequence, gather heads
    y        (batch, heads, T/S, d)   back to this rank's positions

The exchange is its own inverse with the two dimensions swapped, which is its backward.
"""

from __future__ import annotations

import torch

from ...errors import ConfigError


def all_to_all(x: torch.Tensor, comm, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Cut `x` into S pieces along `scatter_dim`, send piece i to sequence rank i, and join the
    pieces received along `gather_dim` in rank order (not differentiable: see SeqAllToAll)."""
    size = comm.world_size
    if size == 1:
        return x
    send = torch.stack(x.chunk(size, dim=scatter_dim)).contiguous()
    recv = torch.empty_like(send)
    comm.all_to_all(recv, send)
    return torch.cat(recv.unbind(0), dim=gather_dim)


class SeqAllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, comm, scatter_dim: int, gather_dim: int) -> torch.Tensor:
        ctx.comm, ctx.dims = comm, (scatter_dim, gather_dim)
        return all_to_all(x, comm, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        scatter_dim, gather_dim = ctx.dims
        return all_to_all(grad.contiguous(), ctx.comm, gather_dim, scatter_dim), None, None, None


class UlyssesAttention:
    """Wraps a core attention `(q, k, v, mask, dropout_p, causal) -> y` over (batch, heads,
    sequence, head_dim) so that it runs on whole sequences and 1/S of the heads."""

    def __init__(self, inner, comm):
        self.inner, self.comm = inner, comm

    def __call__(self, q, k, v, mask, dropout_p, causal):
        if mask is not None:
            raise ConfigError("sequence_parallel_size: an attention mask (padding) is not split by sequence; "
                              "pass no attention mask (pad with -100 labels) or set sequence_parallel_size to 1")
        qkv = SeqAllToAll.apply(torch.stack((q, k, v)), self.comm, 2, 3)  # (3, b, h/S, T, d)
        y = self.inner(qkv[0], qkv[1], qkv[2], None, dropout_p, causal)
        return SeqAllToAll.apply(y, self.comm, 2, 1)  # (b, h/S, T, d) -> (b, h, T/S, d) after the swap


def attach(model: torch.nn.Module, comm) -> int:
    """Wrap the core attention of every zerotrain block in `model`; the number wrapped. Each
    block's head count must divide by the sequence-parallel size."""
    size = comm.world_size
    blocks = [m for m in model.modules() if callable(getattr(m, "core_attention", None))]
    for block in blocks:
        if not getattr(block, "causal", True):  # the engine's loss is next-token (labels shifted)
            raise ConfigError(f"sequence_parallel_size {size}: {type(model).__name__} is not a causal decoder; "
                              "sequence parallelism splits zerotrain's GPT and HF decoders")
        heads = getattr(block, "n_head", None)
        if heads is None or heads % size:
            raise ConfigError(f"sequence_parallel_size {size}: the model has {heads} attention heads per layer, "
                              f"not a multiple of {size}; use a size that divides {heads}")
    for block in blocks:
        if not isinstance(block.core_attention, UlyssesAttention):
            block.core_attention = UlyssesAttention(block.core_attention, comm)
    return len(blocks)
