"""The one place that talks to torch.distributed (see comm.py)."""

from .comm import Comm, ParallelState, init_parallel, shutdown

__all__ = ["Comm", "ParallelState", "init_parallel", "shutdown"]
