"""Memory for whole stage-3 parameters (zero/stage3/pages.py): slots of their own, pages recycled."""

from __future__ import annotations

import mmap
import sys

import pytest
import torch

from zerotrain.zero.stage3.pages import MovedPages, OwnStorages, layer_bytes, whole_buffers

PAGE = mmap.PAGESIZE
FLOATS_PER_PAGE = PAGE // 4
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pages move with Linux's mremap")


def mapped(lo: int, hi: int) -> bool:
    """Is every byte of [lo, hi) in some mapping of this process?"""
    spans = []
    with open("/proc/self/maps") as f:
        for line in f:
            a, b = (int(x, 16) for x in line.split()[0].split("-"))
            if b > lo and a < hi:
                spans.append((max(a, lo), min(b, hi)))
    covered = lo
    for a, b in sorted(spans):
        if a > covered:
            return False
        covered = max(covered, b)
    return covered >= hi


def test_one_layer_is_what_repeats_per_repetition_of_the_rarest_size():
    qkv, out, mlp, emb = 3 * PAGE, PAGE, 4 * PAGE, 9 * PAGE
    assert layer_bytes([emb] + [qkv, out, mlp, mlp] * 10) == qkv + out + 2 * mlp
    assert layer_bytes([emb, qkv, out]) == 0  # nothing repeats: no layer to pool


@linux
def test_released_pages_serve_the_next_parameter_of_that_size_without_a_copy():
    memory = whole_buffers([2 * FLOATS_PER_PAGE] * 3, torch.float32, "cpu")
    assert isinstance(memory, MovedPages)
    memory.acquire(0)
    memory.buffers[0].fill_(7.0)
    memory.release(0)
    assert memory.buffers[0].abs().sum() == 0  # the slot stays mapped and reads zeros
    memory.acquire(1)
    # the pages moved, values and all: nothing was zero-filled or copied
    assert torch.equal(memory.buffers[1], torch.full((2 * FLOATS_PER_PAGE,), 7.0))
    assert memory.pooled_bytes == 0


@linux
def test_the_pool_holds_one_layer_at_most_and_larger_parameters_go_back_to_the_system():
    a, b, c = FLOATS_PER_PAGE, 2 * FLOATS_PER_PAGE, 8 * FLOATS_PER_PAGE
    memory = whole_buffers([a, b, b, a, b, b, c], torch.float32, "cpu")
    assert memory.limit == 5 * PAGE  # a layer: one a, two b
    for i in range(7):
        memory.acquire(i)
        memory.buffers[i].fill_(i + 1)
    for i in range(7):
        memory.release(i)
        assert memory.pooled_bytes <= memory.limit
    assert list(memory.pooled) == [3, 4, 5]  # the latest layer; the first went back
    assert 6 not in memory.pooled  # larger than a layer: never pooled
    memory.acquire(6)
    assert memory.buffers[6].abs().sum() == 0  # fresh pages
    memory.acquire(0)  # pages of its size: 3's, the only ones of that size left
    assert torch.equal(memory.buffers[0], torch.full((a,), 4.0))


@linux
def test_the_mappings_never_get_holes():
    """A hole could be handed to another mmap, which unmapping ours later would destroy."""
    memory = whole_buffers([FLOATS_PER_PAGE] * 4, torch.float32, "cpu")
    total = sum(memory.sizes)
    for step in range(20):
        i, j = step % 4, (step + 1) % 4
        memory.acquire(i)
        memory.buffers[i].fill_(step)
        memory.release(i)
        memory.acquire(j)
        memory.release(j)
        assert mapped(memory.base, memory.base + total) and mapped(memory.pool_base, memory.pool_base + total)


def test_own_storages_free_and_take_back_their_bytes():
    memory = OwnStorages([10, 20], torch.float32, "cpu")
    assert [b.untyped_storage().nbytes() for b in memory.buffers] == [0, 0]
    memory.acquire(1)
    memory.buffers[1].fill_(1.0)
    assert memory.buffers[1].untyped_storage().nbytes() == 80
    memory.release(1)
    assert memory.buffers[1].untyped_storage().nbytes() == 0


def test_accelerators_and_models_without_repeated_shapes_get_own_storages():
    assert isinstance(whole_buffers([FLOATS_PER_PAGE, 3 * FLOATS_PER_PAGE], torch.float32, "cpu"), OwnStorages)
    assert isinstance(whole_buffers([FLOATS_PER_PAGE] * 2, torch.float32, "meta"), OwnStorages)
