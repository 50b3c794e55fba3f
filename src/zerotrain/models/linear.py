"""nn.Linear with a backward that stays fast in bf16/fp16 on CPUs without bf16 units.

On such CPUs (no AVX-512 BF16/AMX) torch's low-precision matmul takes a reference kernel
whose speed depends on the operands' layout: the input gradient, grad_out @ W with W as
stored, runs about 30x slower than the same product against W's transpose laid out in
memory (8.3 s against 0.3 s for 64 x 2048 x 2048 here). This backward computes it in the
fast layout (the same products, summed in another order: equal up to rounding). Elsewhere (fp32,
GPUs, tensor-parallel DTensor weights) it is plain nn.Linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_LOW = (torch.bfloat16, torch.float16)


class _CPULowPrecisionLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.with_bias = bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        flat = grad.reshape(-1, grad.shape[-1])
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:  # grad @ W, with W's transpose contiguous: the fast kernel
            grad_x = (flat @ weight.t().contiguous().t()).view(*grad.shape[:-1], weight.shape[1])
        if ctx.needs_input_grad[1]:
            grad_w = flat.t() @ x.reshape(-1, x.shape[-1])
        if ctx.with_bias and ctx.needs_input_grad[2]:
            grad_b = flat.sum(0)
        return grad_x, grad_w, grad_b


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        # type(w.data) is torch.Tensor: not a tensor-parallel DTensor, whose ops are its own
        if (w.device.type == "cpu" and w.dtype in _LOW and type(w.data) is torch.Tensor and torch.is_grad_enabled()
                and w.requires_grad):
            return _CPULowPrecisionLinear.apply(x, w, self.bias)
        return F.linear(x, w, self.bias)
