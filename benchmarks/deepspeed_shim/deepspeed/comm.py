"""deepspeed.comm is DeepSpeed's facade with torch.distributed's API: here it is torch.distributed."""

import torch.distributed as _dist

from ._harness import init_distributed  # noqa: F401


def __getattr__(name):
    return getattr(_dist, name)
