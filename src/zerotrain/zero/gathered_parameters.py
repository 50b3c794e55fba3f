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

import weakref
from contextlib import contextmanager

import torch

from .partitioned_init import is_partitioned
from .stage3_schedule import EXTERNAL_ATTR

# parameter id -> the stage-3 strategy that shards it
_OWNERS: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()


def register_owner(params, strategy) -> None:
    for p in params:
        _OWNERS[id(p)] = strategy


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
    uses of parameters outside their module are found automatically."""
    params = [params] if torch.is_tensor(params) else list(params)
    if enabled:
        building = [p for p in params if is_partitioned(p)]  # under zero.Init, no engine yet
        if building:
            with _glued(building, modifier_rank):
                with GatheredParameters([p for p in params if not is_partitioned(p)], modifier_rank):
                    yield
            return
    by_owner: dict[int, tuple[object, dict[int, list[int]], list]] = {}
    for p in params:
        owner = _owner_of(p)
        if owner is None:
            continue
        entry = by_owner.setdefault(id(owner), (owner, {}, []))
        gi, i = owner.where[id(p)]
        entry[1].setdefault(gi, []).append(i)
        entry[2].append(p)
    if not enabled or not by_owner:
        yield
        return
    for owner, own, _ in by_owner.values():
        owner.gatherer.gather(own)
    try:
        yield
    finally:
        for owner, own, plist in by_owner.values():
            if modifier_rank is not None:
                owner.write_back(own, modifier_rank)
            owner.gatherer.release(plist)


@contextmanager
def _glued(params, modifier_rank: int | None):
    """zero.Init-built parameters whole for the block; cut again on exit from `modifier_rank`'s values."""
    for p in params:
        p.zt_owner._glue(p)
    try:
        yield
    finally:
        for p in params:
            p.zt_owner._cut(p, src=modifier_rank if modifier_rank is not None else 0)


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
