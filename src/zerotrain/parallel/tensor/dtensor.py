"""Thin wrappers over torch's DTensor tensor parallelism (torch.distributed.tensor.parallel).

zerotrain has no sharded matmul of its own: `parallelize` hands a plan of style names to
torch's `parallelize_module`, whose ColwiseParallel / RowwiseParallel turn each named
Linear's weight into a DTensor sharded over the mesh's "tensor" dimension and insert the
collectives the split needs. One style is added: `fused_colwise`, for a Linear whose output
stacks several projections (zerotrain's attention `qkv` = [q; k; v]): each part is split
colwise, so tensor rank r holds [q_r; k_r; v_r] and its heads stay whole. Its DTensor's
global view is that rank-major order; `full` puts the parts back in the model's order.

The vocabulary split is torch's too: `vocab_embedding` (RowwiseParallel over the embedding's
rows, the token ids replicated: each rank looks up the ids in its range, one all-reduce sums
them) and `vocab_head` (ColwiseParallel whose logits stay a DTensor sharded over the
vocabulary); `loss_parallel` is torch's context in which cross-entropy on such logits
all-reduces only per-token maxima and sums, never the logits themselves. Weights tied across
split layers (GPT's embedding and head: both shard the [vocab, width] matrix by rows) are tied
again after the split.

The rest of zerotrain sees DTensor parameters only through this module: `is_sharded`,
`local` (the plain tensor a rank holds, which ZeRO lays into its flat buffers), `rebind`
(make that tensor a view of a flat buffer), `like` (a gradient over such a view), `full`,
and the per-rank checkpoint state (`rank_state_dict`, `load_rank_state_dict`, and
`split_record`: which dimension each piece is cut on, for joining them offline).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, loss_parallel, parallelize_module
from torch.distributed.tensor.parallel.style import ParallelStyle

FUSED = "fused_parts"  # attribute of a fused_colwise parameter: how many projections it stacks


class FusedColwise(ColwiseParallel):
    def __init__(self, parts: int):
        super().__init__()
        self.parts = parts

    def _partition_linear_fn(self, name, module, device_mesh):
        size = device_mesh.size()
        for pname, param in module.named_parameters():
            rows = param.shape[0]
            order = param.detach().reshape(self.parts, size, rows // (self.parts * size), -1).transpose(0, 1)
            split = distribute_tensor(order.reshape(param.shape).contiguous(), device_mesh, [Shard(0)],
                                      src_data_rank=self.src_data_rank)
            dist_param = nn.Parameter(split, requires_grad=param.requires_grad)
            setattr(dist_param, FUSED, self.parts)
            module.register_parameter(pname, dist_param)


class SharedInput(ParallelStyle):
    """A module whose colwise projections read one input (attention's q, k, v; the MLP's gate
    and up): that input (its first argument, or hidden_states=) becomes a replicated DTensor
    once, at the module, so the projections' input gradients add up as one partial sum and
    are all-reduced once, not once per projection (ColwiseParallel alone converts, and so
    reduces, at each)."""

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        def share(_, args, kwargs):
            if args and isinstance(args[0], torch.Tensor) and not isinstance(args[0], DTensor):
                args = (DTensor.from_local(args[0], device_mesh, [Replicate()], run_check=False), *args[1:])
            elif isinstance(kwargs.get("hidden_states"), torch.Tensor) and not isinstance(kwargs["hidden_states"],
                                                                                           DTensor):
                kwargs["hidden_states"] = DTensor.from_local(kwargs["hidden_states"], device_mesh, [Replicate()],
                                                             run_check=False)
            return args, kwargs

        module.register_forward_pre_hook(share, with_kwargs=True)
        return module


def _style(name: str):
    if name == "colwise":
        return ColwiseParallel()
    if name == "rowwise":
        return RowwiseParallel()
    if name.startswith("fused_colwise:"):
        return FusedColwise(int(name.split(":", 1)[1]))
    if name == "shared_input":
        return SharedInput()
    if name == "vocab_embedding":
        return RowwiseParallel(input_layouts=Replicate())
    if name == "vocab_head":
        return ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    raise ValueError(f"unknown tensor-parallel style {name!r}")


def parallelize(module: nn.Module, device_mesh, plan: dict[str, str]) -> None:
    """Split the submodules named in `plan` ({module path: "colwise" | "rowwise" |
    "fused_colwise:<parts>" | "vocab_embedding" | "vocab_head" | "shared_input"}) over `device_mesh` (one
    dimension). parallelize_module gives each layer its own new parameter: a tie is remade."""
    owners: dict[int, list[tuple[nn.Module, str]]] = {}
    for path, sub in module.named_modules(remove_duplicate=False):
        for name, p in sub.named_parameters(recurse=False, remove_duplicate=False):
            owners.setdefault(id(p), []).append((sub, name))
    parallelize_module(module, device_mesh, {path: _style(style) for path, style in plan.items()})
    for (sub, name), *others in (o for o in owners.values() if len(o) > 1):
        kept = getattr(sub, name)
        for other, other_name in others:
            if isinstance(getattr(other, other_name), DTensor) != isinstance(kept, DTensor):
                raise ValueError(f"a weight tied between {type(sub).__name__} and {type(other).__name__} is split "
                                 "in one of them only")
            setattr(other, other_name, kept)


def loss_context():
    """torch's loss_parallel: cross-entropy (forward and backward) over logits sharded by the
    vocabulary without gathering them."""
    return loss_parallel()


def replicated_local(out, gather: bool = False):
    """`out` (a tensor, a tuple, or a dict-like HF output) with each replicated DTensor (the
    loss loss_parallel returns) as the plain tensor every rank holds; autograd passes through.
    Sharded DTensors (the vocabulary-split logits) stay as they are, or with `gather` are
    gathered whole (an evaluation reads them)."""
    def plain(v):
        if not isinstance(v, DTensor):
            return v
        return v.full_tensor() if gather and is_sharded(v) else v if is_sharded(v) else v.to_local()

    if isinstance(out, dict):
        for k, v in list(out.items()):
            out[k] = plain(v)
        return out
    if isinstance(out, tuple) and not hasattr(out, "_fields"):
        return type(out)(plain(v) for v in out)
    return plain(out)
    if isinstance(out, tuple) and not hasattr(out, "_fields"):
        return type(out)(replicated_local(v) for v in out)
    return out


def is_sharded(t: torch.Tensor) -> bool:
    """A DTensor that holds a different piece on each tensor rank (not a replica)."""
    return isinstance(t, DTensor) and any(not isinstance(p, Replicate) for p in t.placements)


def local(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor this rank holds (the tensor itself when it is not a DTensor)."""
    return t._local_tensor if isinstance(t, DTensor) else t


def rebind(p: torch.Tensor, view: torch.Tensor) -> None:
    """Make the storage a parameter computes with `view` (a slice of a flat buffer). A DTensor
    keeps its placements and metadata; its local tensor becomes the view."""
    if isinstance(p, DTensor):
        p._local_tensor = view
    else:
        p.data = view


def like(p: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """`view` as a gradient for `p`: itself, or a DTensor with p's placements over it, so
    autograd accumulates into the view in place."""
    if not isinstance(p, DTensor):
        return view
    grad = DTensor.from_local(view, p.device_mesh, p.placements, shape=p.shape, stride=p.stride(), run_check=False)
    grad._local_tensor = view  # from_local holds a view of it: the flat buffer's own view, so `is` finds it next time
    return grad


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor on every rank (a collective over the tensor dimension for a DTensor),
    fused parts back in the model's order."""
    if not isinstance(t, DTensor):
        return t
    parts = getattr(t, FUSED, None)
    return model_order(t.full_tensor(), t.device_mesh.size(), parts) if parts else t.full_tensor()


def model_order(whole: torch.Tensor, size: int, parts: int) -> torch.Tensor:
    """A fused_colwise tensor's rows from its rank-major order ([q_0; k_0; v_0; q_1; ...], the
    tensor ranks' pieces one after another) back in the model's ([q; k; v])."""
    rows = whole.shape[0]
    return whole.reshape(size, parts, rows // (size * parts), -1).transpose(0, 1).reshape(whole.shape)


def split_record(module: nn.Module) -> dict | None:
    """How the module state's DTensors are cut over the tensor ranks, as plain data for a
    checkpoint (so `zerotrain consolidate` joins the pieces without the model): {"size": T,
    "rank": r, "split": {key: {"dim": d, "shape": [whole shape], "parts": p}}}, replicated
    ones left out (every rank holds them whole); None when the module has no DTensor."""
    split, mesh = {}, None
    for key, value in module.state_dict(keep_vars=True).items():  # the parameters themselves: FUSED kept
        if isinstance(value, DTensor):
            mesh = value.device_mesh
            shards = [p.dim % value.ndim for p in value.placements if isinstance(p, Shard)]
            if shards:
                split[key] = {"dim": shards[0], "shape": list(value.shape), "parts": getattr(value, FUSED, 1)}
    return None if mesh is None else {"size": mesh.size(), "rank": mesh.get_local_rank(), "split": split}


def rank_state_dict(module: nn.Module) -> dict:
    """The module state dict with plain tensors: each DTensor as the piece this rank holds
    (what a rank's checkpoint file keeps; torch.load(weights_only=True) reads it back)."""
    return {k: local(v) for k, v in module.state_dict().items()}


def load_rank_state_dict(module: nn.Module, state: dict, strict: bool = False):
    """Load what rank_state_dict wrote: pieces go into DTensors' local tensors, the rest as
    module.load_state_dict does. Returns (missing, unexpected) keys."""
    current = module.state_dict(keep_vars=True)
    pieces = {k for k, v in current.items() if isinstance(v, DTensor) and k in state}
    rest = {k: v for k, v in state.items() if k not in pieces}
    missing, unexpected = module.load_state_dict(rest, strict=False)
    with torch.no_grad():
        for k in pieces:
            target = local(current[k])
            if tuple(state[k].shape) != tuple(target.shape):
                raise RuntimeError(f"{k}: the checkpoint holds a piece of shape {tuple(state[k].shape)}, this "
                                   f"tensor rank's is {tuple(target.shape)}")
            target.copy_(state[k])
    return [k for k in missing if k not in pieces], unexpected
