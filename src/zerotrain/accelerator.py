"""`deepspeed.accelerator` under zerotrain's name: the DeepSpeed-named alias of
helpers/accelerator.py (CPU and CUDA behind DeepSpeed's accelerator calls).

    from zerotrain.accelerator import get_accelerator
"""

from .helpers.accelerator import CPU_Accelerator, CUDA_Accelerator, get_accelerator, set_accelerator
from .helpers.refusals import missing

__all__ = ["get_accelerator", "set_accelerator", "CPU_Accelerator", "CUDA_Accelerator"]
__getattr__ = missing(__name__, way="the accelerator is get_accelerator() (CPU or CUDA)")
