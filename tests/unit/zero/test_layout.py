"""The sharding arithmetic (zero/layout.py): properties over any shapes and world sizes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zerotrain.zero.layout import (ALIGN, CHUNKED, FLAT, GroupLayout, chunked_shard_numel, cut, fill_from_piece,
                                   flat_padded_numel, glue, piece_from)

shapes = st.lists(st.integers(0, 7), min_size=0, max_size=3).map(tuple)
worlds = st.integers(1, 9)
numel_lists = st.lists(st.integers(0, 70), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(shape=shapes, world=worlds)
def test_cut_then_glue_is_the_identity(shape, world):
    x = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)
    chunks = cut(x.reshape(-1), world)
    assert chunks.shape[0] == world and chunks.shape[1] * world >= x.numel()
    assert chunks.shape[1] * world - x.numel() < world  # fewer than N elements of padding
    assert torch.equal(glue(chunks, shape), x)
    assert torch.equal(glue(torch.cat(list(chunks)), shape), x)  # chunks gathered end to end


def _params(numels):
    return [torch.arange(n, dtype=torch.float64) + 1000 * i for i, n in enumerate(numels)]


@settings(max_examples=300, deadline=None)
@given(numels=numel_lists, world=worlds, scheme=st.sampled_from([FLAT, CHUNKED]), sharded=st.booleans())
def test_pieces_cover_every_element_once_and_glue_back(numels, world, scheme, sharded):
    layout = GroupLayout(numels, world, scheme, sharded)
    params = _params(numels)
    hits = [torch.zeros(n, dtype=torch.int64) for n in numels]
    ranks = range(world) if layout.sharded else range(1)
    pieces = []
    for rank in ranks:
        lo, hi = layout.piece_range(rank)
        piece = torch.full((hi - lo,), -1.0, dtype=torch.float64)
        pieces.append(piece_from(params, layout.spans(rank), piece))
        for s in layout.spans(rank):
            hits[s.index][s.param_lo : s.param_lo + s.numel] += 1
            assert s.numel > 0  # a span names a part a rank holds, never an empty one
    assert all(bool((h == 1).all()) for h in hits)
    assert layout.numel == sum(layout.numels)  # the elements a piece holds before its padding
    whole = [torch.zeros(n, dtype=torch.float64) for n in numels]
    for rank, piece in zip(ranks, pieces):
        fill_from_piece(whole, layout.spans(rank), piece)
    assert all(torch.equal(a, b) for a, b in zip(whole, params))


@settings(max_examples=200, deadline=None)
@given(numels=numel_lists, world=worlds)
def test_flat_shards_are_equal_aligned_and_cover_the_buffer(numels, world):
    layout = GroupLayout(numels, world, FLAT)
    assert layout.padded_numel == flat_padded_numel(sum(numels), world) >= sum(numels)
    assert layout.padded_numel % (world * ALIGN) == 0
    ranges = [layout.shard_range(r) for r in range(world)]
    assert ranges[0][0] == 0 and ranges[-1][1] == layout.padded_numel
    assert all(hi - lo == layout.shard_numel and lo % ALIGN == 0 for lo, hi in ranges)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert layout.shard_edges() == [lo for lo, _ in ranges[1:]]
    assert all(layout.owner_of(o) == r for r, (lo, hi) in enumerate(ranges) for o in (lo, hi - 1))
    # a parameter sits at its offset; offsets are contiguous
    assert layout.offsets == [sum(numels[:i]) for i in range(len(numels))]


@settings(max_examples=200, deadline=None)
@given(numels=numel_lists, world=worlds)
def test_chunked_rank_holds_chunk_r_of_every_parameter(numels, world):
    layout = GroupLayout(numels, world, CHUNKED)
    assert layout.shard_numel == chunked_shard_numel(layout.numels) >= sum(layout.numels)
    assert layout.shard_numel % ALIGN == 0
    for rank in range(world):
        for s in layout.spans(rank):
            chunk = layout.numels[s.index]
            assert s.param_lo == rank * chunk and s.piece_lo == layout.offsets[s.index]
            assert s.numel == min(chunk, numels[s.index] - rank * chunk)
    params = _params(numels)
    for i, p in enumerate(params):  # cut() is the same arithmetic as the layout's chunks
        assert cut(p, world).shape[1] == layout.numels[i]


@settings(max_examples=100, deadline=None)
@given(numels=numel_lists, world=worlds, scheme=st.sampled_from([FLAT, CHUNKED]), stage=st.integers(0, 3))
def test_a_recorded_layout_reads_back_the_same(numels, world, scheme, stage):
    layout = GroupLayout(numels, world, scheme, sharded=stage > 0)
    saved = layout.describe([f"p{i}" for i in range(len(numels))], [(n,) for n in numels])
    again = GroupLayout.from_saved(saved, scheme, world, stage)
    assert [again.spans(r) for r in range(world)] == [layout.spans(r) for r in range(world)]


def test_a_tampered_layout_is_refused():
    saved = GroupLayout([10, 20], 2).describe(["a", "b"], [(10,), (20,)])
    saved["offsets"] = [0, 11]
    with pytest.raises(ValueError, match="^recorded offsets or shard size differ from the layout's own arithmetic$"):
        GroupLayout.from_saved(saved, FLAT, 2, 1)


def test_a_recorded_layout_names_its_parameters_and_shapes():
    saved = GroupLayout([6, 20], 2, CHUNKED).describe(["a", "b"], [(2, 3), torch.Size([4, 5])])
    assert saved["names"] == ["a", "b"] and saved["shapes"] == [[2, 3], [4, 5]]  # consolidate reads them
    assert saved["full_numels"] == [6, 20] and saved["numels"] == [3, 10]


def test_an_unknown_scheme_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown layout scheme 'striped'"):
        GroupLayout([4], 2, "striped")


def test_a_flat_layout_is_sharded_unless_told_otherwise():
    layout = GroupLayout([40, 24], 2)
    assert layout.sharded and layout.piece_range(1) == (layout.shard_numel, 2 * layout.shard_numel)


def test_a_shard_size_from_a_count_is_that_of_a_chunk_list():
    assert chunked_shard_numel(17) == chunked_shard_numel([10, 7]) == 32
    assert chunked_shard_numel(0) == chunked_shard_numel([]) == ALIGN


def test_unsharded_flat_piece_is_the_whole_buffer():
    layout = GroupLayout([5, 7], 4, FLAT, sharded=False)
    assert layout.piece_range(3) == (0, layout.padded_numel)
    assert [(s.index, s.param_lo, s.piece_lo, s.numel) for s in layout.spans(0)] == [(0, 0, 0, 5), (1, 0, 5, 7)]
