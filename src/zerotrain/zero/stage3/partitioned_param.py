"""Stage-3 parameters that notice being touched.

A partitioned parameter is an empty tensor whenever no module hook has gathered it. Module
hooks (schedule.py) cover a module's own parameters around its own forward; two
situations need a parameter's values without them:

    under zero.Init     model code initialises, copies or reads a parameter whose module
                        was already cut (HF's _init_weights, torch.nn.init, copy.deepcopy
                        of a layer as nn.TransformerEncoder does): it is glued whole for
                        that use and cut again later (init.py)
    during a pass       a module uses a parameter it does not own (nn.MultiheadAttention
                        reads out_proj.weight itself; a tied head in the root's forward; a
                        functional call): it is gathered on the spot and, from then on,
                        gathered with that module (schedule.py)

So `PartitionedParameter.__torch_function__` sees every torch call on such a parameter and
asks its owner (`zt_owner`: the Init context, then the stage-3 schedule) to make it whole
first. Shape queries (shape, size, dim, numel) always answer with the full shape, whole or
not, without moving any data (so counting a model's parameters works at stage 3), and
zerotrain's own bookkeeping (.data assignment, .grad, hooks) passes straight through.
Outside a pass a parameter stays empty, as DeepSpeed's do; a computation that then fails on
it is re-raised as one line naming the parameter (use GatheredParameters there). Every
rank runs the same model code, so the collectives these trigger line up across ranks.
"""

from __future__ import annotations

import copy
from typing import Protocol

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

# Calls that only ask about the shape: answered by a meta tensor of the full shape.
_META_METHODS = frozenset({"dim", "ndimension", "size", "numel", "nelement", "stride", "__len__"})
_META_ATTRS = frozenset({"shape", "ndim", "nbytes"})  # dtype, device... are the empty tensor's own
# Bookkeeping on the parameter object itself, never its values.
_PASS_METHODS = frozenset({"register_hook", "register_post_accumulate_grad_hook", "requires_grad_",
                           "__reduce_ex__", "__setstate__", "_is_view", "data_ptr", "untyped_storage", "storage",
                           "__deepcopy__", "__repr__", "__format__", "__hash__", "__eq__", "retain_grad",
                           "element_size", "is_floating_point", "is_complex", "get_device", "type", "is_signed"})
META, PASS, VALUE = "meta", "pass", "value"


def is_grad_assignment(func) -> bool:
    descriptor = getattr(func, "__self__", None)
    return getattr(descriptor, "__name__", None) == "grad" and getattr(func, "__name__", "") == "__set__"


def classify(func) -> str:
    """What a torch call on a parameter needs from it: its shape, nothing, or its values."""
    descriptor = getattr(func, "__self__", None)
    if type(descriptor).__name__ == "getset_descriptor":  # a property: p.data, p.grad, p.shape...
        name = descriptor.__name__
        if name in _META_ATTRS:
            return META
        return VALUE if name == "data" and func.__name__ == "__get__" else PASS
    name = getattr(func, "__name__", "")
    if name in _META_METHODS:
        return META
    return PASS if name in _PASS_METHODS else VALUE


class TouchHandler(Protocol):
    """The owner of a partitioned parameter (zero.Init while it builds, then the stage-3 schedule)."""

    def is_empty(self, p: nn.Parameter) -> bool:
        """True when `p` holds none of its values on this rank now (only its chunk, elsewhere)."""

    def make_whole(self, params: list[nn.Parameter], func) -> None:
        """Make the empty `params` whole before `func` runs on them, where this owner can
        (a collective on every rank); those it cannot stay empty."""

    def explain_failure(self, p: nn.Parameter, func, error: Exception) -> Exception | None:
        """A clear error for `func` failing on an empty `p` this owner could not gather, or None."""


class PartitionedParameter(nn.Parameter):
    """An nn.Parameter whose values may live as per-rank chunks (see the module docstring).

    `zt_shape` is its full shape; `zt_owner` its TouchHandler."""

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        with torch._C.DisableTorchFunctionSubclass():
            data = self.data.clone()
            requires_grad = self.requires_grad
        result = nn.Parameter(data, requires_grad)
        result.__class__ = PartitionedParameter
        memo[id(self)] = result
        # the chunk, shape and owner travel with the copy (nn.Parameter's own copy drops them)
        for key, value in self.__dict__.items():
            setattr(result, key, value if key == "zt_owner" else copy.deepcopy(value, memo))
        return result

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = classify(func)
        params = _params_in(args, kwargs) if kind != PASS else ()
        touched = [t for t in params if getattr(t, "zt_owner", None) is not None and t.zt_owner.is_empty(t)]
        if touched and kind == META:
            args, kwargs = _with_meta(touched, args, kwargs)
        elif touched:
            touched[0].zt_owner.make_whole(touched, func)
        try:
            return torch._C._disabled_torch_function_impl(func, types, args, kwargs)
        except (RuntimeError, IndexError, ValueError) as e:  # on a parameter still empty: say why
            for t in params or _params_in(args, kwargs):
                owner = getattr(t, "zt_owner", None)
                if owner is not None and owner.is_empty(t):
                    clear = owner.explain_failure(t, func, e)
                    if clear is not None:
                        raise clear from None
            raise


def _params_in(args, kwargs) -> list[PartitionedParameter]:
    out = []
    for x in (*args, *kwargs.values()):
        if isinstance(x, PartitionedParameter):
            out.append(x)
        elif isinstance(x, (list, tuple, dict)):
            out += [t for t in tree_leaves(x) if isinstance(t, PartitionedParameter)]
    return out


def _with_meta(touched, args, kwargs):
    """The same call with each empty parameter replaced by a meta tensor of its full shape."""
    with torch._C.DisableTorchFunctionSubclass():
        meta = {id(t): torch.empty(t.zt_shape, dtype=t.dtype, device="meta") for t in touched}
    swap = lambda x: meta.get(id(x), x) if isinstance(x, PartitionedParameter) else x  # noqa: E731
    return tuple(swap(a) for a in args), {k: swap(v) for k, v in kwargs.items()}


def make_partitioned(p: nn.Parameter, owner: TouchHandler, shape: torch.Size) -> None:
    """Turn `p` into a PartitionedParameter in place (same object: optimizers and modules keep it)."""
    if type(p) is not PartitionedParameter:
        p.__class__ = PartitionedParameter
    p.zt_shape = torch.Size(shape)
    p.zt_owner = owner


def make_plain(p: nn.Parameter) -> None:
    """Undo make_partitioned (the parameter must already hold its whole value)."""
    for key in ("zt_shape", "zt_owner"):
        p.__dict__.pop(key, None)
    if type(p) is PartitionedParameter:
        p.__class__ = nn.Parameter
