"""`deepspeed.runtime` under zerotrain's name: utils (set_random_seed, see_memory_usage),
engine (DeepSpeedEngine), config (DeepSpeedConfig), zero (zerotrain.zero itself) and
data_pipeline (the data analyzer), each an alias of zerotrain's own."""

import sys

from .. import zero
from ..helpers.refusals import missing

sys.modules[__name__ + ".zero"] = zero  # `from zerotrain.runtime.zero import GatheredParameters`
__getattr__ = missing(__name__, way="zerotrain.runtime has utils, engine, config, zero and data_pipeline")
