"""ALST's memory pieces under DeepSpeed's names: compute over tiles of the sequence so that the
large intermediates of a long sequence exist one tile at a time.

    x (batch, T, hidden) --tile--> x[:, 0:t]  x[:, t:2t] ...  (T / tiles positions each)
    forward   each tile under no_grad; only x is kept       -> outputs joined (or the loss reduced)
    backward  each tile again with grad, its gradient taken -> dx written into its slice,
              and dropped before the next                      parameter gradients summed

    TiledMLP.apply(fn, self, x, shards, compute_params)       fn(self, x_tile): the MLP; keeps
        x, never the (batch, T, intermediate) activations of the whole sequence
    sequence_tiled_compute(fn, seqlen, shards, kwargs_to_shard, kwargs_to_pass,
                           grad_requiring_tensor_key, compute_params=None,
                           output_unshard_dimension=1, output_reduction="mean")
        any fn(**kwargs) over tiles of the dim-1 tensors in kwargs_to_shard
    TiledFusedLogitsLoss.apply(fn, self, x, y, mask, shards, compute_params, output_reduction)
        fn(self, x_tile, y_tile[, mask_tile]) -> a scalar loss: the logits of a tile at a time

The forward runs twice (once more in backward): the price of holding one tile's activations.
Parameter gradients are delivered once per call, summed over the tiles, as gradients of the
function's own inputs (`compute_params`; TiledMLP and TiledFusedLogitsLoss default to the
parameters of `self` when it is a module), so ZeRO's gradient hooks see each parameter once,
and a weight tied elsewhere (GPT's head is its embedding) receives one gradient. With
compute_params None and no module, the tiles' backward accumulates into `.grad` directly
(several times per step: fine without ZeRO 2 and 3's reduction hooks, wrong under them).
DeepSpeed's TiledFusedLogitsLoss runs the backward during the forward; here it runs in
backward like the others (same values and gradients, one more pass of the head), so
gradients arrive while ZeRO expects them.

zerotrain's GPT turns both on with GPTConfig(mlp_tiles=n, loss_tiles=n); `tile_model(model,
mlp_tiles, loss_tiles)` does the same for an HF decoder (its *MLP modules and its loss).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ...errors import ConfigError
from .batch import IGNORE


@dataclass
class _Plan:
    """How the tensors are cut and the outputs joined. `call(*tile_tensors)` is one tile's fn."""

    call: Callable
    dims: list[int]  # the tiled dimension of each tiled input
    shards: int
    join: str  # "cat" (along out_dim), "stack" (a scalar per tile) or "sum"/"mean" over the joined
    out_dim: int = 1
    accumulate: bool = False  # no params given: the tiles' backward accumulates into .grad


def _bounds(length: int, shards: int) -> list[tuple[int, int]]:
    step = math.ceil(length / shards)
    return [(s, min(step, length - s)) for s in range(0, length, step)]


def _reduce(outputs: list[torch.Tensor], plan: _Plan) -> torch.Tensor:
    if plan.join == "cat":
        return torch.cat(outputs, dim=plan.out_dim)
    joined = torch.stack(outputs)
    return joined.sum() if plan.join == "sum" else joined.mean() if plan.join == "mean" else joined


def _out_grad(grad: torch.Tensor, plan: _Plan, tile: int, start: int, length: int, count: int) -> torch.Tensor:
    """The gradient reaching tile `tile`'s output."""
    if plan.join == "cat":
        return grad.narrow(plan.out_dim, start, length)
    if plan.join == "stack":
        return grad[tile]
    return grad / count if plan.join == "mean" else grad


def _apply(plan: _Plan, tiled: list, params: list) -> torch.Tensor:
    """Run the tiles. Each parameter is touched first (a cheap `detach`): a ZeRO-3 parameter
    that is partitioned here is gathered by that use (stage 3 then counts it with the module
    running), so autograd records its whole shape for the gradient this call returns."""
    for p in params:
        p.detach()
    return _Tiled.apply(plan, len(tiled), *tiled, *params)


class _Tiled(torch.autograd.Function):
    """inputs: the tiled tensors (cut along their `plan.dims`), then the parameters."""

    @staticmethod
    def forward(ctx, plan: _Plan, n_tiled: int, *tensors):
        tiled, params = tensors[:n_tiled], tensors[n_tiled:]
        ctx.plan, ctx.n_tiled = plan, n_tiled
        ctx.save_for_backward(*tiled)
        ctx.params = params  # parameters stay alive with their module; no need to save them
        length = tiled[0].shape[plan.dims[0]]
        with torch.no_grad():
            outputs = [plan.call(*(t.narrow(d, s, n) for t, d in zip(tiled, plan.dims)))
                       for s, n in _bounds(length, plan.shards)]
        return _reduce(outputs, plan)

    @staticmethod
    def backward(ctx, grad):
        plan, tiled, params = ctx.plan, ctx.saved_tensors, ctx.params
        length = tiled[0].shape[plan.dims[0]]
        bounds = _bounds(length, plan.shards)
        wanted = [t.requires_grad for t in tiled]
        grads = [torch.zeros_like(t) if w else None for t, w in zip(tiled, wanted)]
        trained = [p for p in params if p.requires_grad]
        sums = [None] * len(trained)
        for tile, (start, n) in enumerate(bounds):
            pieces = [t.detach().narrow(d, start, n).requires_grad_(w) for t, d, w in zip(tiled, plan.dims, wanted)]
            with torch.enable_grad():
                out = plan.call(*pieces)
            g = _out_grad(grad, plan, tile, start, n, len(bounds))
            inputs = [p for p, w in zip(pieces, wanted) if w]
            if plan.accumulate:  # no parameters named: into .grad, as a plain backward would
                torch.autograd.backward(out, g)
                got = [p.grad for p in inputs]
            else:
                got = torch.autograd.grad(out, inputs + trained, g, allow_unused=True)
                for i, part in enumerate(got[len(inputs):]):
                    if part is not None:
                        sums[i] = part if sums[i] is None else sums[i] + part
            it = iter(got[:len(inputs)])
            for t_grad, d, w in zip(grads, plan.dims, wanted):
                part = next(it) if w else None
                if part is not None:
                    t_grad.narrow(d, start, n).copy_(part)
        param_grads = iter(sums)
        out_params = [next(param_grads) if p.requires_grad else None for p in params]
        return (None, None, *grads, *out_params)


def _params(compute_params, module) -> tuple[list, bool]:
    """The parameters whose gradients the call returns, and whether it must accumulate instead."""
    if compute_params is not None:
        return list(compute_params), False
    if isinstance(module, torch.nn.Module):
        return list(module.parameters()), False
    return [], True


def _check_shards(shards, who: str) -> int:
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ConfigError(f"{who}: shards {shards!r} should be a positive integer")
    return shards


class TiledMLP:
    """`TiledMLP.apply(fn, self, x, shards, compute_params)`: fn(self, x) over `shards` tiles of
    x's second-last dimension (the sequence)."""

    @staticmethod
    def apply(fn, self, x: torch.Tensor, shards: int, compute_params=None) -> torch.Tensor:
        params, accumulate = _params(compute_params, self)
        plan = _Plan(lambda piece: fn(self, piece), [x.dim() - 2], _check_shards(shards, "TiledMLP"), "cat",
                     x.dim() - 2, accumulate)
        return _apply(plan, [x], params)


def sequence_tiled_compute(fn, seqlen: int, shards: int, kwargs_to_shard: dict, kwargs_to_pass: dict,
                           grad_requiring_tensor_key: str, compute_params=None, output_unshard_dimension: int = 1,
                           output_reduction: str | None = "mean"):
    """fn(**tiles of kwargs_to_shard along dim 1, **kwargs_to_pass), joined along
    `output_unshard_dimension` (0: each tile returns a scalar, stacked), then reduced
    ("mean", "sum" or None: the joined output). Only `grad_requiring_tensor_key` receives a
    gradient among the tiled inputs; the parameters, those in `compute_params`."""
    if output_reduction not in (None, "mean", "sum"):
        raise ConfigError(f"sequence_tiled_compute: output_reduction {output_reduction!r} should be None, "
                          "'mean' or 'sum'")
    if grad_requiring_tensor_key not in kwargs_to_shard:
        raise ConfigError(f"sequence_tiled_compute: grad_requiring_tensor_key {grad_requiring_tensor_key!r} is not "
                          f"one of kwargs_to_shard ({', '.join(kwargs_to_shard)})")
    for key, value in kwargs_to_shard.items():
        if value.shape[1] != seqlen:
            raise ConfigError(f"sequence_tiled_compute: {key} has {value.shape[1]} positions on dim 1, seqlen is "
                              f"{seqlen}; pass tensors of shape (batch, seqlen, ...)")
    keys = list(kwargs_to_shard)
    tensors = [v if k == grad_requiring_tensor_key else v.detach() for k, v in kwargs_to_shard.items()]

    def call(*pieces):
        return fn(**dict(zip(keys, pieces)), **kwargs_to_pass)

    params, accumulate = _params(compute_params, None)
    join = "cat" if output_unshard_dimension != 0 else "stack"
    plan = _Plan(call, [1] * len(keys), _check_shards(shards, "sequence_tiled_compute"), join,
                 output_unshard_dimension, accumulate)
    out = _apply(plan, tensors, params)
    if output_reduction is None:
        return out
    return out.mean() if output_reduction == "mean" else out.sum()


class TiledFusedLogitsLoss:
    """`TiledFusedLogitsLoss.apply(fn, self, x, y, mask, shards, compute_params,
    output_reduction)`: fn(self, x_tile, y_tile[, mask_tile]) -> a scalar loss per tile, over
    `shards` tiles of the flattened (batch x sequence) positions, "mean" (of the tiles' losses)
    or "sum"."""

    @staticmethod
    def apply(fn, self, x: torch.Tensor, y: torch.Tensor, mask, shards: int, compute_params=None,
              output_reduction: str = "mean") -> torch.Tensor:
        who = "TiledFusedLogitsLoss"
        if output_reduction not in ("mean", "sum"):
            raise ConfigError(f"{who}: output_reduction {output_reduction!r} should be 'mean' or 'sum'")
        if x.dim() < 2 or y.dim() < 2 or x.shape[:2] != y.shape[:2]:
            raise ConfigError(f"{who}: x {tuple(x.shape)} and y {tuple(y.shape)} should both be (batch, seqlen, ...)")
        if mask is not None and tuple(mask.shape) != tuple(x.shape[:2]):
            raise ConfigError(f"{who}: mask {tuple(mask.shape)} should be (batch, seqlen) = {tuple(x.shape[:2])}")
        tiled = [x.flatten(0, 1), y.flatten(0, 1).detach()] + ([] if mask is None else [mask.flatten().detach()])
        params, accumulate = _params(compute_params, self)
        plan = _Plan(lambda *pieces: fn(self, *pieces), [0] * len(tiled), _check_shards(shards, who),
                     output_reduction, 0, accumulate)
        return _apply(plan, tiled, params)


def tiled_loss_sum(hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor,
                   shards: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the cross-entropy summed over the real labels of `targets` in fp32, their count), the
    logits `head(hidden)` made one tile of positions at a time."""

    def loss(module, x, y):
        return F.cross_entropy(module(x).float(), y, ignore_index=IGNORE, reduction="sum")

    total = TiledFusedLogitsLoss.apply(loss, head, hidden, targets, None, shards, list(head.parameters()), "sum")
    return total, (targets != IGNORE).sum()


def tile_model(model: torch.nn.Module, mlp_tiles: int = 1, loss_tiles: int = 1) -> torch.nn.Module:
    """Tile an HF causal decoder in place: each module whose class name ends in "MLP" runs
    through TiledMLP over `mlp_tiles` tiles, and a loss from `labels` or `shift_labels` is
    computed over `loss_tiles` tiles of positions (the output then has no logits). Returns
    the model."""
    _check_shards(mlp_tiles, "tile_model mlp_tiles")
    _check_shards(loss_tiles, "tile_model loss_tiles")
    if mlp_tiles > 1:
        mlps = [m for m in model.modules() if type(m).__name__.endswith("MLP")]
        if not mlps:
            raise ConfigError(f"tile_model: {type(model).__name__} has no module whose class name ends in 'MLP'; "
                              "tile its feed-forward with TiledMLP.apply in its forward")
        for mlp in mlps:
            plain = type(mlp).forward
            mlp.forward = lambda x, mlp=mlp, plain=plain: TiledMLP.apply(plain, mlp, x, mlp_tiles)
    if loss_tiles > 1:
        body, head = getattr(model, "model", None), model.get_output_embeddings()
        if body is None or head is None:
            raise ConfigError(f"tile_model: {type(model).__name__} has no .model body and output embeddings; "
                              "tile its loss with TiledFusedLogitsLoss.apply")
        model.forward = _tiled_lm_forward(model, body, head, loss_tiles)
        model.scores_shift_labels = True  # the sequence-parallel engine passes its targets
    return model


def _tiled_lm_forward(model, body, head, shards: int):
    plain = model.forward

    def forward(input_ids=None, labels=None, shift_labels=None, **kwargs):
        if labels is None and shift_labels is None:
            return plain(input_ids=input_ids, **kwargs)
        from transformers.modeling_outputs import CausalLMOutputWithPast

        targets = shift_labels if shift_labels is not None else F.pad(labels[:, 1:], (0, 1), value=IGNORE)
        hidden = body(input_ids=input_ids, **kwargs).last_hidden_state
        total, count = tiled_loss_sum(hidden, head, targets, shards)
        return CausalLMOutputWithPast(loss=total / count.clamp(min=1))

    return forward
