"""nn.Linear that computes its bf16/fp16 products in fp32 on CPUs without bf16 units.

On such CPUs (no AVX-512 BF16/AMX) torch's low-precision matmul takes a reference kernel:
7 GFLOP/s here against 60-80 for fp32, and its speed depends on the operands' layout (grad_out
@ W as stored ran 30x slower than against W's transpose). A product of two bf16 (or fp16)
numbers is exact in fp32, so upcasting the operands and multiplying in fp32 is the GPU's
bf16 GEMM (exact products, fp32 sums) rounded once at the end: on a 2-layer width-2048 GPT
here forward 3.8x and backward 4.2x faster than the reference kernel, and its loss 4e-6 from
fp32's against 1e-4. The fp32 weight is a temporary of one layer, made again in backward,
never kept; it and the fp32 weight gradient go into two buffers each thread reuses.
Elsewhere (fp32, GPUs, tensor-parallel DTensor weights) it is plain nn.Linear.
"""

from __future__ import annotations

import math
import threading

import torch
import torch.nn.functional as F
from torch import nn

_LOW = (torch.bfloat16, torch.float16)
_SCRATCH_MOST = 1 << 26  # elements (256 MB of fp32): larger temporaries are allocated each time
_scratch = threading.local()


def _fp32(t: torch.Tensor, slot: str) -> torch.Tensor:
    """`t` in fp32, in this thread's reused buffer `slot`: a fresh 64 MB tensor costs 8x the
    conversion itself in page faults (malloc maps large blocks anew each time)."""
    return _buffer(slot, t.shape).copy_(t)


def _buffer(slot: str, shape) -> torch.Tensor:
    n = math.prod(shape)
    if n > _SCRATCH_MOST:
        return torch.empty(shape, dtype=torch.float32)
    buf = getattr(_scratch, slot, None)
    if buf is None or buf.numel() < n:
        buf = torch.empty(n, dtype=torch.float32)
        setattr(_scratch, slot, buf)
    return buf[:n].view(shape)


def _fp32_linear(x, weight, bias):
    out = F.linear(x.float(), _fp32(weight, "weight"), None if bias is None else bias.float())
    return out.to(x.dtype)


class _CPULowPrecisionLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.bias_dtype = None if bias is None else bias.dtype
        return _fp32_linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        flat = grad.reshape(-1, grad.shape[-1]).float()
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = (flat @ _fp32(weight, "weight")).to(grad.dtype).view(*grad.shape[:-1], weight.shape[1])
        if ctx.needs_input_grad[1]:
            grad_w = torch.mm(flat.t(), x.reshape(-1, x.shape[-1]).float(), out=_buffer("grad", weight.shape))
            grad_w = grad_w.to(weight.dtype)
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            grad_b = flat.sum(0).to(ctx.bias_dtype)
        return grad_x, grad_w, grad_b


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        # type(w.data) is torch.Tensor: not a tensor-parallel DTensor, whose ops are its own
        if w.device.type == "cpu" and w.dtype in _LOW and type(w.data) is torch.Tensor:
            if torch.is_grad_enabled() and (w.requires_grad or x.requires_grad):
                return _CPULowPrecisionLinear.apply(x, w, self.bias)
            return _fp32_linear(x, w, self.bias)
        return F.linear(x, w, self.bias)
