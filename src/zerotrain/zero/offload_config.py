"""`deepspeed.runtime.zero.offload_config` under zerotrain's name: the enums of
`engine.offload_states()` (offload/states.py) and the offload blocks of the config."""

from ..config.zero import OffloadOptimizerConfig as DeepSpeedZeroOffloadOptimizerConfig
from ..config.zero import OffloadParamConfig as DeepSpeedZeroOffloadParamConfig
from ..helpers.refusals import missing
from .offload.states import OffloadDeviceEnum, OffloadStateTypeEnum

__all__ = ["OffloadDeviceEnum", "OffloadStateTypeEnum", "DeepSpeedZeroOffloadOptimizerConfig",
           "DeepSpeedZeroOffloadParamConfig"]
__getattr__ = missing(__name__, way="it has OffloadDeviceEnum, OffloadStateTypeEnum and the offload config blocks")
