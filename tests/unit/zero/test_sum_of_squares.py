"""The sum of squares the gradient norm is made of: float64, so the same however it is cut."""

from __future__ import annotations

import math

import torch

from zerotrain.zero.layout import cut
from zerotrain.zero.strategy import _SQUARES_BLOCK_CPU, sum_of_squares


def exact(t: torch.Tensor) -> float:
    return math.fsum(x * x for x in t.double().tolist())


def test_every_cut_of_a_buffer_gives_its_exact_sum_of_squares():
    g = torch.randn(3 * _SQUARES_BLOCK_CPU + 12345, generator=torch.Generator().manual_seed(0)) * 1e-3
    whole = sum_of_squares([g])
    assert whole.dtype == torch.float64 and whole.shape == (1,)
    truth = exact(g)
    # whole, flat shards of 2-5 ranks at uneven points, stage 3's chunks, parameter-sized pieces
    cuts = [[g], list(g.split(g.numel() // 2 + 7)), list(g.split(g.numel() // 3 + 1)),
            list(cut(g, 4)), list(g.split(1000)), list(g.split(_SQUARES_BLOCK_CPU - 1))]
    for pieces in cuts:
        got = sum_of_squares(pieces).item()
        # torch's fp32 norm squared: 1.1e-6 off whole, 5.8e-7 off in two shards
        assert abs(got - truth) / truth < 1e-13


def test_low_precision_blocks_and_non_finite_values():
    g = torch.randn(2 * _SQUARES_BLOCK_CPU + 5, generator=torch.Generator().manual_seed(1)).bfloat16()
    g[7] = 300.0
    assert abs(sum_of_squares([g]).item() - exact(g)) / exact(g) < 1e-13
    big = torch.full((4,), 3e38)  # finite fp32 values whose fp32 sum of squares would overflow
    assert math.isfinite(sum_of_squares([big]).item())
    g[-1] = float("inf")
    assert sum_of_squares([g]).isinf().all()
    g[-1] = float("nan")
    assert sum_of_squares([g[:10], g]).isnan().all()
    assert sum_of_squares([]).item() == 0.0
