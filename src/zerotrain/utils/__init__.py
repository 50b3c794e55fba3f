"""`deepspeed.utils` under zerotrain's name: the DeepSpeed-named alias of helpers/logs.py
(logger, log_dist) and of pipe's RepeatingLoader; zero_to_fp32 is the submodule of that name."""

from ..helpers.logs import log_dist, logger
from ..helpers.refusals import missing
from ..pipe import RepeatingLoader

__all__ = ["logger", "log_dist", "RepeatingLoader"]
__getattr__ = missing(__name__, way="zerotrain.utils has logger, log_dist, RepeatingLoader and zero_to_fp32")
