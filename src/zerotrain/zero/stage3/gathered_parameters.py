"""`zerotrain.zero.GatheredParameters`: temporary whole access to ZeRO-3 parameters.

    with GatheredParameters(model.lm_head.parameters(), modifier_rank=0):
        if rank == 0:
            model.lm_head.weight.mul_(0.5)   # changes reach every rank's shard on exit

Every rank must enter the context (the gather is a collective). Parameters that are not
sharded pass through untouched, so the same code runs at every stage. Parameters built
under zero.Init and not yet handed to an engine work too (glued, and cut again on exit:
the way to load pretrained weights into a partitioned model, one tensor at a time).
"""

from __future__ import annotations

import warnings
import weakref
from contextlib import contextmanager

import torch

from ...errors import GatheredModificationWarning
from .init import full_shape, is_partitioned
from .schedule import EXTERNAL_ATTR

# parameter id -> the stage-3 strategy that shards it
_OWNERS: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()


def register_owner(params, strategy, module: torch.nn.Module | None = None) -> None:
    """`module`'s names go on its parameters (`zt_name`), for messages that name them."""
    for p in params:
        _OWNERS[id(p)] = strategy
    for name, p in module.named_parameters() if module is not None else ():
        p.zt_name = name


def _owner_of(p):
    """The engine that shards `p`: an id outlives its parameter and may come back on another
    one, so the owner must still hold this very parameter at that place."""
    owner = _OWNERS.get(id(p))
    if owner is None or id(p) not in owner.where:
        return None
    gi, i = owner.where[id(p)]
    return owner if owner.groups[gi].params[i] is p else None


@contextmanager
def GatheredParameters(params, modifier_rank: int | None = None, fwd_module=None, enabled: bool = True):
    """`fwd_module` (DeepSpeed's, for registering external parameters) has no effect here:
    uses of parameters outside their module are found automatically. With `modifier_rank`
    None nothing written inside is kept: an in-place change there (on any rank) is discarded
    when the parameters are partitioned again as they were, and every rank warns
    (GatheredModificationWarning) naming the parameters changed."""
    params = [params] if torch.is_tensor(params) else list(params)
    building = [p for p in params if enabled and is_partitioned(p)]  # under zero.Init, no engine yet
    by_owner: dict[int, tuple[object, dict[int, list[int]], list]] = {}
    for p in params if enabled else ():
        owner = None if is_partitioned(p) else _owner_of(p)
        if owner is None:
            continue
        entry = by_owner.setdefault(id(owner), (owner, {}, []))
        gi, i = owner.where[id(p)]
        entry[1].setdefault(gi, []).append(i)
        entry[2].append(p)
    if not building and not by_owner:
        yield
        return
    chunks = [p.zt_chunk for p in building]  # what the ranks hold now, kept if nothing may change
    for p in building:
        p.zt_owner._glue(p)
    for owner, own, _ in by_owner.values():
        owner.gatherer.gather(own)
    gathered = building + [p for _, _, plist in by_owner.values() for p in plist]
    before = [(p.data_ptr(), p._version) for p in gathered]
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        changed = []
        if modifier_rank is None:
            comm = building[0].zt_owner.comm if building else next(iter(by_owner.values()))[0].comm
            changed = _changed_anywhere(comm, gathered, before)
        for p, chunk in zip(building, chunks):
            if modifier_rank is None:
                p.zt_chunk, p.data = chunk, torch.empty(0, dtype=p.dtype, device=p.device)
            else:
                p.zt_owner._cut(p, src=modifier_rank)
        for owner, own, plist in by_owner.values():
            if modifier_rank is not None:
                owner.write_back(own, modifier_rank)
            owner.gatherer.release(plist, force=bool(changed))  # a changed persistent one: from the shards again
        if changed and not failed:
            warnings.warn(
                f"GatheredParameters(modifier_rank=None): the in-place changes to {changed} inside the block are "
                "discarded (the parameters are partitioned again as they were); pass modifier_rank=<rank> to give "
                "every rank that rank's values", GatheredModificationWarning, stacklevel=3)


@contextmanager
def unwrap_model_for_generation(model):
    """DeepSpeed's (for generation loops, e.g. TRL's): generating runs many short forwards, and
    at stage 3 each would gather and release every module again. Here every parameter of
    `model` (an engine or a module) is gathered once for the block, the stage-3 module hooks
    stand aside (nothing released, no pass recorded, so training prefetches as it did) and all
    is released on exit. With nothing partitioned (stages 0-2) the block just runs. Yields
    `model` itself (an engine's forward and `generate` reach its module)."""
    params = list(model.parameters())
    owners = list({id(o): o for o in map(_owner_of, params) if o is not None}.values())
    for owner in owners:
        owner.schedule.pause()
    try:
        with GatheredParameters(params):
            yield model
    finally:
        for owner in owners:
            owner.schedule.resume()


def _changed_anywhere(comm, params: list, before: list[tuple[int, int]]) -> str:
    """A description of the parameters changed on any rank since `before` ('' if none); a
    collective (one flag all-reduced), so every rank answers the same."""
    with torch._C.DisableTorchFunctionSubclass():  # the tensors as they are: nothing gathered
        # a parameter a module hook released meanwhile reads as empty: only its version tells
        mine = [i for i, (p, (ptr, version)) in enumerate(zip(params, before))
                if p._version != version or (p.numel() and p.data_ptr() != ptr)]
    flags = torch.zeros(len(params), dtype=torch.int32)
    flags[mine] = 1
    comm.all_reduce(flags, op="max")
    hit = flags.nonzero().flatten().tolist()
    if not hit:
        return ""
    named = ", ".join(getattr(params[i], "zt_name", None) or f"the parameter of shape {tuple(full_shape(params[i]))}"
                      for i in hit[:5])
    return named + (f" and {len(hit) - 5} more" if len(hit) > 5 else "")


def register_external_parameter(module: torch.nn.Module, parameter: torch.nn.Parameter) -> None:
    """DeepSpeed's: `module`'s forward uses `parameter`, which another module owns, so ZeRO-3
    gathers it with `module`. zerotrain finds such uses itself on their first pass; declaring
    one ahead saves that first synchronous gather. Before initialize the declaration is kept
    on the module; after, it goes to the engine that shards the parameter."""
    owner = _owner_of(parameter)
    if owner is not None:
        owner.schedule.add_external(module, parameter)
        return
    declared = module.__dict__.setdefault(EXTERNAL_ATTR, [])
    if all(q is not parameter for q in declared):
        declared.append(parameter)


def unregister_external_parameter(module: torch.nn.Module, parameter: torch.nn.Parameter) -> None:
    """DeepSpeed's counterpart; with uses found automatically it only forgets a declaration
    not yet handed to an engine."""
    declared = module.__dict__.get(EXTERNAL_ATTR, [])
    module.__dict__[EXTERNAL_ATTR] = [q for q in declared if q is not parameter]
