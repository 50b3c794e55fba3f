"""`deepspeed.runtime.data_pipeline.data_routing` under zerotrain's name: scheduler and helper."""

from ....helpers.refusals import missing

__getattr__ = missing(__name__, way="random-LTD is zerotrain.data_efficiency: RandomLTDScheduler, "
                                    "convert_to_random_ltd, save_without_random_ltd")
