"""zerotrain's Linear: on CPU in bf16/fp16, the products of fp32 rounded once (the GPU's
low-precision GEMM); in fp32, nn.Linear's numbers exactly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zerotrain.models.linear import Linear


def _pair(dtype, bias=True):
    """(ours in dtype, nn.Linear in fp32 with the same dtype-rounded weights)."""
    torch.manual_seed(0)
    ours = Linear(1024, 40, bias=bias).to(dtype)
    reference = nn.Linear(1024, 40, bias=bias)
    reference.load_state_dict({k: v.float() for k, v in ours.state_dict().items()})
    return ours, reference


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("bias", [True, False])
def test_low_precision_is_fp32_rounded_once(dtype, bias):
    ours, reference = _pair(dtype, bias)
    x = torch.randn(3, 5, 1024, dtype=dtype)
    xa, xb = x.clone().requires_grad_(), x.float().requires_grad_()
    ya, yb = ours(xa), reference(xb)
    assert (ya.grad_fn.name() == "_CPULowPrecisionLinearBackward") == (dtype != torch.float32)
    assert ya.dtype == dtype
    torch.testing.assert_close(ya, yb.to(dtype), rtol=0, atol=0)
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g.float())
    torch.testing.assert_close(xa.grad, xb.grad.to(dtype), rtol=0, atol=0)
    torch.testing.assert_close(ours.weight.grad, reference.weight.grad.to(dtype), rtol=0, atol=0)
    if bias:
        torch.testing.assert_close(ours.bias.grad, reference.bias.grad.to(dtype), rtol=0, atol=0)
    if dtype != torch.float32:  # and near torch's own low-precision kernel
        theirs = nn.Linear(1024, 40, bias=bias).to(dtype)
        theirs.load_state_dict(ours.state_dict())
        torch.testing.assert_close(ya, theirs(x), rtol=2e-2, atol=2e-2)


def test_frozen_weight_and_no_grad():
    ours, reference = _pair(torch.bfloat16)
    ours.weight.requires_grad_(False)
    x = torch.randn(2, 1024, dtype=torch.bfloat16, requires_grad=True)
    xb = x.detach().float().requires_grad_()
    g = torch.randn(2, 40)
    ours(x).backward(g.bfloat16())
    reference(xb).backward(g.bfloat16().float())
    assert ours.weight.grad is None
    torch.testing.assert_close(x.grad, xb.grad.bfloat16(), rtol=0, atol=0)
    with torch.no_grad():
        y = ours(x)
        assert y.grad_fn is None
        torch.testing.assert_close(y, reference(x.float()).bfloat16(), rtol=0, atol=0)
