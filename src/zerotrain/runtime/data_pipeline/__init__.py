"""`deepspeed.runtime.data_pipeline` under zerotrain's name: data_routing (random-LTD's scheduler
and helper) and data_sampling.data_analyzer (the data analyzer), aliases of
zerotrain.data_efficiency."""

from ...helpers.refusals import missing

__getattr__ = missing(__name__, way="random-LTD and the data analyzer are zerotrain.data_efficiency (or "
                                    "data_routing and data_sampling.data_analyzer here); the sampling curriculum "
                                    "is the config's data_efficiency block")
