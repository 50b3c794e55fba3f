"""`deepspeed.utils.logging` under zerotrain's name: the alias of helpers/logs.py."""

from ..helpers.logs import log_dist, logger

__all__ = ["logger", "log_dist"]
