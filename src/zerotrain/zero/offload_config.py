"""`deepspeed.runtime.zero.offload_config` under zerotrain's name: the enums of
`engine.offload_states()` (offload/states.py) and the offload blocks of the config. Absolute
imports: `zerotrain.runtime.zero` is this package under another name, so the module may be
loaded under either."""

from zerotrain.config.zero import OffloadOptimizerConfig as DeepSpeedZeroOffloadOptimizerConfig
from zerotrain.config.zero import OffloadParamConfig as DeepSpeedZeroOffloadParamConfig
from zerotrain.helpers.refusals import missing
from zerotrain.zero.offload.states import OffloadDeviceEnum, OffloadStateTypeEnum

__all__ = ["OffloadDeviceEnum", "OffloadStateTypeEnum", "DeepSpeedZeroOffloadOptimizerConfig",
           "DeepSpeedZeroOffloadParamConfig"]
__getattr__ = missing(__name__, way="it has OffloadDeviceEnum, OffloadStateTypeEnum and the offload config blocks")
