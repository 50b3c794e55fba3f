"""The one place that talks to torch.distributed (see collectives.py). torch's DTensor and
pipelining layers are wrapped beside the parallelism that uses them instead
(parallel/tensor/dtensor.py, parallel/pipeline/schedules.py). As a package it is also
DeepSpeed's `deepspeed.comm` (facade.py): `import zerotrain.comm as dist; dist.get_rank()`."""

from .collectives import Comm, ParallelState, init_parallel, shutdown
from .facade import *  # noqa: F403  (DeepSpeed's deepspeed.comm names)
from .facade import __all__ as _facade_names

__all__ = ["Comm", "ParallelState", "init_parallel", "shutdown", *_facade_names]
