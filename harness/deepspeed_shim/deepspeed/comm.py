"""deepspeed.comm is DeepSpeed's facade with torch.distributed's API: here it is torch.distributed,
with one allowance for gloo (below)."""

import torch.distributed as _dist

from ._harness import init_distributed  # noqa: F401


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    """gloo gathers 1-d pieces only, and DeepSpeed's test helpers (reduce_boolean_flags) gather a
    0-d flag, which NCCL takes: the same one element, viewed as 1-d."""
    if input_tensor.dim() == 0:
        input_tensor = input_tensor.reshape(1)
    return _dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)


def __getattr__(name):
    return getattr(_dist, name)
