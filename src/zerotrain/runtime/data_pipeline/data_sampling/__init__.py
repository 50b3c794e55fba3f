"""`deepspeed.runtime.data_pipeline.data_sampling` under zerotrain's name: data_analyzer,
variable_batch_size_and_lr."""

from ....helpers.refusals import missing

__getattr__ = missing(__name__, way="zerotrain.runtime.data_pipeline.data_sampling has data_analyzer and "
                                  "variable_batch_size_and_lr")
