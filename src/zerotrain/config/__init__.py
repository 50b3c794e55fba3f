"""DeepSpeed-compatible JSON config: `load_config` returns one validated, typed tree whose
values are the ones the engine uses; `read_config` is the one reader, `fill_auto` the one
"auto" filler; `report` says where each value came from."""

from .auto import TRAINER_FILLS, autos_left, fill_auto
from .base import ACTS, EFFECTS, NO_EFFECT, REFUSED
from .data_efficiency import (
    CurriculumMetricConfig,
    DataCurriculumConfig,
    DataEfficiencyConfig,
    DataRoutingConfig,
    DataSamplingConfig,
    DynamicBatchingConfig,
    LayerTokenLRConfig,
    RandomLTDConfig,
    RandomLTDScheduleConfig,
    RandomLTDStepConfig,
    ScheduleConfig,
)
from .extras import DeepSpeedExtras
from .batch import resolve_batch_sizes
from .loader import load_config, tensor_parallel_size
from .reader import read_config
from .schema import (
    BF16Config,
    CurriculumConfig,
    FP16Config,
    OptimizerConfig,
    PLDConfig,
    SchedulerConfig,
    TokenBudgetConfig,
    ZeroTrainConfig,
)
from .zero import OffloadOptimizerConfig, OffloadParamConfig, ZeroConfig

__all__ = [
    "ACTS",
    "EFFECTS",
    "NO_EFFECT",
    "REFUSED",
    "TRAINER_FILLS",
    "BF16Config",
    "CurriculumConfig",
    "CurriculumMetricConfig",
    "DataCurriculumConfig",
    "DataEfficiencyConfig",
    "DataRoutingConfig",
    "DataSamplingConfig",
    "DeepSpeedExtras",
    "DynamicBatchingConfig",
    "FP16Config",
    "LayerTokenLRConfig",
    "OffloadOptimizerConfig",
    "OffloadParamConfig",
    "OptimizerConfig",
    "PLDConfig",
    "RandomLTDConfig",
    "RandomLTDScheduleConfig",
    "RandomLTDStepConfig",
    "ScheduleConfig",
    "SchedulerConfig",
    "TokenBudgetConfig",
    "ZeroConfig",
    "ZeroTrainConfig",
    "autos_left",
    "fill_auto",
    "load_config",
    "read_config",
    "resolve_batch_sizes",
    "tensor_parallel_size",
]
