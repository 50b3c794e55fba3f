"""zerotrain's Linear: nn.Linear's numbers, with the fast-layout backward on CPU in bf16/fp16."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zerotrain.models.linear import Linear


def _pair(dtype, bias=True):
    torch.manual_seed(0)
    ours, theirs = Linear(24, 40, bias=bias).to(dtype), nn.Linear(24, 40, bias=bias).to(dtype)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("bias", [True, False])
def test_gradients_are_nn_linears(dtype, bias):
    ours, theirs = _pair(dtype, bias)
    x = torch.randn(3, 5, 24, dtype=dtype)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ours(xa), theirs(xb)
    assert (ya.grad_fn.name() == "_CPULowPrecisionLinearBackward") == (dtype != torch.float32)
    torch.testing.assert_close(ya, yb, rtol=0, atol=0)
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    tol = {"rtol": 0, "atol": 0} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(xa.grad, xb.grad, **tol)
    torch.testing.assert_close(ours.weight.grad, theirs.weight.grad, **tol)
    if bias:
        torch.testing.assert_close(ours.bias.grad, theirs.bias.grad, **tol)


def test_frozen_weight_and_no_grad_take_the_plain_path():
    ours, _ = _pair(torch.bfloat16)
    ours.weight.requires_grad_(False)
    x = torch.randn(2, 24, dtype=torch.bfloat16, requires_grad=True)
    ours(x).sum().backward()
    assert ours.weight.grad is None and x.grad is not None
    with torch.no_grad():
        assert ours(x).grad_fn is None
