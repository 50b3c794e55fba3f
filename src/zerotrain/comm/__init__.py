"""The one place that talks to torch.distributed (see collectives.py). torch's DTensor and
pipelining layers are wrapped beside the parallelism that uses them instead
(parallel/tensor/dtensor.py, parallel/pipeline/schedules.py)."""

from .collectives import Comm, ParallelState, init_parallel, shutdown

__all__ = ["Comm", "ParallelState", "init_parallel", "shutdown"]
