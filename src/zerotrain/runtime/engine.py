"""`deepspeed.runtime.engine` under zerotrain's name: DeepSpeedEngine is engine/engine.py's Engine,
the class of what initialize returns (isinstance checks hold)."""

from ..engine.engine import Engine as DeepSpeedEngine
from ..helpers.refusals import missing

__all__ = ["DeepSpeedEngine"]
__getattr__ = missing(__name__, way="the engine is zerotrain.DeepSpeedEngine, built by zerotrain.initialize")
