"""The rank-disjoint, seeded, resumable sampler and the loader `initialize` builds on it."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch

from zerotrain.data import DistributedSampler, build_dataloader


def epoch_of(n: int, world: int, **kw) -> list[list[int]]:
    """One epoch's indices, per rank."""
    return [list(DistributedSampler(n, rank, world, **kw)) for rank in range(world)]


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("shuffle", [True, False])
def test_divisible_epoch_is_split_disjointly(world, shuffle):
    n = 12
    parts = epoch_of(n, world, seed=5, shuffle=shuffle)
    assert all(len(p) == n // world for p in parts)
    assert all(len(p) == len(DistributedSampler(n, r, world)) for r, p in enumerate(parts))
    flat = [i for p in parts for i in p]
    assert sorted(flat) == list(range(n))  # disjoint and covering
    if not shuffle:
        assert parts[0][:2] == [0, world]  # strided over the unshuffled order


@pytest.mark.parametrize("world, n", [(2, 7), (2, 11), (3, 7), (3, 10), (3, 11)])
def test_padding_when_not_divisible(world, n):
    parts = epoch_of(n, world, seed=1)
    per_rank = -(-n // world)
    assert [len(p) for p in parts] == [per_rank] * world
    assert [len(DistributedSampler(n, r, world)) for r in range(world)] == [per_rank] * world
    counts = Counter(i for p in parts for i in p)
    assert set(counts) == set(range(n))  # every sample seen
    # only the padding is repeated, once each
    assert sum(counts.values()) - n == per_rank * world - n
    assert max(counts.values()) == 2


@pytest.mark.parametrize("world, n", [(2, 1), (3, 1), (3, 2)])
def test_padding_when_the_dataset_is_smaller_than_the_world(world, n):
    """Every rank must get len(sampler) indices, or ranks run different step counts and hang."""
    parts = epoch_of(n, world, seed=0)
    assert [len(p) for p in parts] == [len(DistributedSampler(n, r, world)) for r in range(world)] == [1] * world
    assert set(i for p in parts for i in p) == set(range(n))


@pytest.mark.parametrize("world", [1, 2, 3])
def test_drop_last(world):
    n = 11
    parts = epoch_of(n, world, seed=2, drop_last=True)
    assert [len(p) for p in parts] == [n // world] * world
    assert [len(DistributedSampler(n, r, world, drop_last=True)) for r in range(world)] == [n // world] * world
    flat = [i for p in parts for i in p]
    assert len(set(flat)) == len(flat) == (n // world) * world  # nothing repeated


def test_order_depends_on_seed_and_epoch_only():
    a = list(DistributedSampler(20, 0, 2, seed=3))
    b = list(DistributedSampler(20, 0, 2, seed=3))
    assert a == b
    assert a != list(DistributedSampler(20, 0, 2, seed=4))
    other_epoch = DistributedSampler(20, 0, 2, seed=3)
    other_epoch.set_epoch(1)
    assert list(other_epoch) != a
    # the global RNG has no influence
    torch.manual_seed(123)
    c = list(DistributedSampler(20, 0, 2, seed=3))
    torch.manual_seed(456)
    assert c == a == list(DistributedSampler(20, 0, 2, seed=3))
    # each epoch is still a disjoint cover across ranks
    s0, s1 = DistributedSampler(20, 0, 2, seed=3), DistributedSampler(20, 1, 2, seed=3)
    s0.set_epoch(4)
    s1.set_epoch(4)
    assert sorted(list(s0) + list(s1)) == list(range(20))


def test_epoch_advances_after_a_full_pass():
    sampler = DistributedSampler(10, 1, 2, seed=0)
    first = list(sampler)
    assert sampler.epoch == 1 and sampler.position == 0
    second = list(sampler)
    assert sampler.epoch == 2
    fresh = DistributedSampler(10, 1, 2, seed=0)
    fresh.set_epoch(1)
    assert second == list(fresh) and second != first


@pytest.mark.parametrize("world", [1, 2, 3])
def test_state_dict_mid_epoch_resumes_exactly(world):
    n, taken = 17, 3
    for rank in range(world):
        sampler = DistributedSampler(n, rank, world, seed=9)
        list(sampler)  # finish epoch 0, so the resume is in epoch 1
        it = iter(sampler)
        head = list(itertools.islice(it, taken))
        state = sampler.state_dict()
        assert state["epoch"] == 1 and state["position"] == taken

        resumed = DistributedSampler(n, rank, world, seed=0)  # seed comes from the state
        resumed.load_state_dict(state)
        rest = list(resumed)
        reference = DistributedSampler(n, rank, world, seed=9)
        reference.set_epoch(1)
        whole = list(reference)
        assert head + rest == whole
        # and the resumed sampler moves on to epoch 2 like the original would
        assert resumed.epoch == 2 and resumed.position == 0
        reference2 = DistributedSampler(n, rank, world, seed=9)
        reference2.set_epoch(2)
        assert list(resumed) == list(reference2)


def test_build_dataloader_yields_micro_batches():
    data = torch.utils.data.TensorDataset(torch.arange(22.0).unsqueeze(1))
    loaders = [build_dataloader(data, 4, rank, 2, seed=1) for rank in range(2)]
    batches = [list(loader) for loader in loaders]
    # 11 samples per rank in micro-batches of 4: 4, 4, 3
    assert [[b[0].shape[0] for b in bs] for bs in batches] == [[4, 4, 3], [4, 4, 3]]
    seen = torch.cat([b[0] for bs in batches for b in bs]).flatten().long().tolist()
    assert sorted(seen) == list(range(22))
    assert all(isinstance(loader.sampler, DistributedSampler) for loader in loaders)
    assert loaders[0].sampler.epoch == 1  # a full pass advanced the epoch
    dropped = build_dataloader(data, 4, 0, 2, drop_last=True)
    assert [b[0].shape[0] for b in dropped] == [4, 4]


def test_dataloader_resumes_mid_epoch():
    data = torch.utils.data.TensorDataset(torch.arange(16.0))
    loader = build_dataloader(data, 2, 0, 1, seed=3)
    it = iter(loader)
    first = [next(it)[0].tolist() for _ in range(3)]
    state = loader.sampler.state_dict()
    resumed = build_dataloader(data, 2, 0, 1, seed=3)
    resumed.sampler.load_state_dict(state)
    rest = [b[0].tolist() for b in resumed]
    whole = [b[0].tolist() for b in build_dataloader(data, 2, 0, 1, seed=3)]
    assert first + rest == whole


def test_collate_fn_is_used():
    data = list(range(6))
    loader = build_dataloader(data, 3, 0, 1, shuffle=False, collate_fn=lambda items: ("batch", items))
    assert list(loader) == [("batch", [0, 1, 2]), ("batch", [3, 4, 5])]
