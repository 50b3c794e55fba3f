"""The one place that talks to torch.distributed (see collectives.py)."""

from .collectives import Comm, ParallelState, init_parallel, shutdown

__all__ = ["Comm", "ParallelState", "init_parallel", "shutdown"]
