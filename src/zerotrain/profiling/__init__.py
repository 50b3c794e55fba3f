"""`deepspeed.profiling` under zerotrain's name: flops_profiler (get_model_profile)."""

from ..helpers.refusals import missing

__getattr__ = missing(__name__, way="zerotrain.profiling has flops_profiler.get_model_profile")
