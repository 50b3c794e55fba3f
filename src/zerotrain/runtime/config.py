"""`deepspeed.runtime.config` under zerotrain's name: DeepSpeedConfig reads a config as initialize
does (config/loader.py)."""

from ..helpers.refusals import missing


def DeepSpeedConfig(config, mpu=None, world_size: int | None = None):
    """The typed config (`.train_batch_size`, `.zero_optimization.stage`, ...) of a path, JSON
    string or dict, its batch sizes resolved for `world_size` data-parallel ranks (default: the
    process group's size). `mpu` has no effect."""
    from ..comm import facade
    from ..config import load_config

    return load_config(config, world_size=world_size or facade.get_world_size())


__all__ = ["DeepSpeedConfig"]
__getattr__ = missing(__name__, way="read a config with zerotrain.DeepSpeedConfig(path_or_dict)")
