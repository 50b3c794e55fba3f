"""`deepspeed.profiling.flops_profiler` under zerotrain's name: the DeepSpeed-named alias of
helpers/flops.py (get_model_profile over torch's FlopCounterMode)."""

from ..helpers.flops import get_model_profile
from ..helpers.refusals import missing

__all__ = ["get_model_profile"]
__getattr__ = missing(__name__, way="profile a model with get_model_profile(model, input_shape=... or args=...)")
