"""`deepspeed.runtime` under zerotrain's name: utils (set_random_seed, see_memory_usage),
engine (DeepSpeedEngine), config (DeepSpeedConfig), zero (zerotrain.zero itself),
data_pipeline (the data analyzer) and sequence_parallel.ulysses_sp (ALST's names), each an
alias of zerotrain's own."""

import sys

from .. import zero
from ..helpers.refusals import missing
from ..zero import offload_config

sys.modules[__name__ + ".zero"] = zero  # `from zerotrain.runtime.zero import GatheredParameters`
# its submodules found through that alias would load a second time under the alias's name
sys.modules[__name__ + ".zero.offload_config"] = offload_config
__getattr__ = missing(__name__, way="zerotrain.runtime has utils, engine, config, zero, data_pipeline and "
                      "sequence_parallel")
