"""`deepspeed.runtime.data_pipeline.data_sampling.variable_batch_size_and_lr` under zerotrain's
name: the alias of zerotrain.data_efficiency.variable_batch_size_and_lr (dynamic batching)."""

from ....data_efficiency.variable_batch_size_and_lr import *  # noqa: F401,F403
from ....data_efficiency.variable_batch_size_and_lr import __all__  # noqa: F401
from ....helpers.refusals import missing

__getattr__ = missing(__name__, way="zerotrain.data_efficiency.variable_batch_size_and_lr holds dynamic batching")
