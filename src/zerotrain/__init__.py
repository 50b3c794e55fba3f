"""zerotrain: ZeRO data-parallel training for language models, DeepSpeed-config compatible.

    engine, optimizer, loader, scheduler = zerotrain.initialize(model=m, config="ds.json")
    loss = engine(batch); engine.backward(loss); engine.step()
"""

import sys

from .errors import CheckpointError, ConfigError, DataError, DistributedFaultError, NonFiniteStepsError
from .features import CurriculumScheduler, ProgressiveLayerDrop
from .initialize import initialize
from .precision import DynamicLossScaler
from .schedules import get_scheduler
from .zero.estimate import estimate_memory
from .features import layer_drop as layerdrop

# `zerotrain.layerdrop` (wrap, LayerDrop, keep_mask) is the public name of the one layer-drop
# module, features/layer_drop.py; registered so `import zerotrain.layerdrop` works too.
sys.modules[__name__ + ".layerdrop"] = layerdrop

__version__ = "0.1.0"

__all__ = ["initialize", "get_scheduler", "DynamicLossScaler", "CurriculumScheduler", "ProgressiveLayerDrop",
           "ConfigError", "DataError", "CheckpointError", "NonFiniteStepsError", "DistributedFaultError", "estimate_memory", "__version__"]


def __getattr__(name: str):
    # zerotrain.Trainer / TrainingArguments / TrainerCallback load the trainer package (and its
    # HF imports) only when asked for, so `import zerotrain` stays light for engine users.
    if name in ("Trainer", "TrainingArguments", "TrainerCallback"):
        from . import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'zerotrain' has no attribute {name!r}")
