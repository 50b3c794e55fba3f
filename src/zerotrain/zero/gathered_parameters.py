"""`zerotrain.zero.GatheredParameters`: temporary whole access to ZeRO-3 parameters.

    with GatheredParameters(model.lm_head.parameters(), modifier_rank=0):
        if rank == 0:
            model.lm_head.weight.mul_(0.5)   # changes reach every rank's shard on exit

Every rank must enter the context (the gather is a collective). Parameters that are not
sharded pass through untouched, so the same code runs at every stage.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager

import torch

# parameter id -> the stage-3 strategy that shards it
_OWNERS: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()


def register_owner(params, strategy) -> None:
    for p in params:
        _OWNERS[id(p)] = strategy


@contextmanager
def GatheredParameters(params, modifier_rank: int | None = None, enabled: bool = True):
    params = [params] if torch.is_tensor(params) else list(params)
    by_owner: dict[int, tuple[object, dict[int, list[int]], list]] = {}
    for p in params:
        owner = _OWNERS.get(id(p))
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
