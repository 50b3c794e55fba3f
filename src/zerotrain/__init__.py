"""zerotrain: ZeRO data-parallel training for language models, DeepSpeed-config compatible.

    engine, optimizer, loader, scheduler = zerotrain.initialize(model=m, config="ds.json")
    loss = engine(batch); engine.backward(loss); engine.step()
"""

from .errors import CheckpointError, ConfigError, DataError
from .initialize import initialize
from .precision import DynamicLossScaler
from .schedules import get_scheduler

__version__ = "0.1.0"

__all__ = ["initialize", "get_scheduler", "DynamicLossScaler", "ConfigError", "DataError",
           "CheckpointError", "__version__"]
