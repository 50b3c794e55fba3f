"""checkpoint/resplit.py's cut of one tensor's pieces from one tensor size to another."""

from __future__ import annotations

import pytest
import torch

from zerotrain.checkpoint.resplit import check_divides, cut_piece
from zerotrain.errors import CheckpointError
from zerotrain.parallel.tensor.dtensor import model_order


def pieces(whole: torch.Tensor, dim: int, parts: int, size: int) -> list[torch.Tensor]:
    """What `size` tensor ranks hold: each part cut on `dim`, a rank's blocks of every part in order."""
    per_part = whole.chunk(parts, dim)
    return [torch.cat([p.chunk(size, dim)[r] for p in per_part], dim) for r in range(size)]


@pytest.mark.parametrize("dim,parts", [(0, 1), (1, 1), (0, 3)])
@pytest.mark.parametrize("old,new", [(2, 4), (4, 2), (2, 1), (1, 2), (4, 4), (2, 2)])
def test_every_new_piece_is_cut_from_the_old_ones(dim, parts, old, new):
    whole = torch.arange(12 * 8 * 3, dtype=torch.float32).reshape(12 * 3 if dim == 0 else 12, 8 if dim == 0 else 24)
    was, want = pieces(whole, dim, parts, old), pieces(whole, dim, parts, new)
    for r in range(new):
        read = []
        got = cut_piece(lambda t: (read.append(t), was[t].reshape(-1))[1], list(whole.shape), dim, parts, old, new, r)
        assert torch.equal(got, want[r].reshape(-1))
        # only the old pieces it overlaps are read: [r/new, (r+1)/new) against [t/old, (t+1)/old)
        assert read == [t for t in range(old) if t * new < (r + 1) * old and r * old < (t + 1) * new]


def test_fused_pieces_are_the_rank_major_order_dtensor_uses():
    """A fused q/k/v weight of 2 ranks, rank-major as FusedColwise lays it, back in model order."""
    whole = torch.randn(12, 4)
    joined = torch.cat(pieces(whole, 0, 3, 2), 0)
    assert torch.equal(model_order(joined, 2, 3), whole)


def test_a_size_that_does_not_divide_names_the_parameter_and_dimension():
    with pytest.raises(CheckpointError, match=r"h.0.mlp.fc.weight: dimension 0 has 6 elements, not divisible by the "
                                              r"tensor size 4"):
        check_divides("h.0.mlp.fc.weight", [6, 8], 0, 1, 4)
    with pytest.raises(CheckpointError, match=r"qkv.weight: dimension 0 has 12 elements \(3 fused parts of 4\)"):
        check_divides("qkv.weight", [12, 8], 0, 3, 8)
    check_divides("fc.weight", [8, 8], 1, 1, 4)
