"""The gradient norm of a large low-precision shard, block by block, is torch's fp32 norm."""

from __future__ import annotations

import torch

from zerotrain.zero.strategy import _NORM_BLOCK, fp32_norm


def test_block_by_block_equals_the_whole_norm():
    g = torch.randn(3 * _NORM_BLOCK + 12345, generator=torch.Generator().manual_seed(0)).bfloat16()
    g[7] = 300.0
    want = torch.linalg.vector_norm(g, dtype=torch.float32)
    got = fp32_norm(g)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    g[-1] = float("inf")
    assert fp32_norm(g).isinf()
    small = torch.randn(10).bfloat16()
    assert torch.equal(fp32_norm(small), torch.linalg.vector_norm(small, dtype=torch.float32))
