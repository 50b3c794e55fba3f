"""`deepspeed.runtime.data_pipeline` under zerotrain's name: data_routing (random-LTD's scheduler
and helper), aliases of zerotrain.data_efficiency."""

from ...helpers.refusals import missing

__getattr__ = missing(__name__, way="random-LTD is zerotrain.data_efficiency (or data_routing here); the sampling "
                                    "curriculum is the config's data_efficiency block")
