"""`deepspeed.checkpointing` under zerotrain's name: the DeepSpeed-named alias of
helpers/activation_checkpointing.py (configure, checkpoint, is_configured over torch.utils.checkpoint).
"""

from .helpers.activation_checkpointing import (checkpoint, configure, is_configured, non_reentrant_checkpoint,
                                               reset, set_num_layers)
from .helpers.refusals import missing

__all__ = ["configure", "checkpoint", "non_reentrant_checkpoint", "is_configured", "reset", "set_num_layers"]
__getattr__ = missing(__name__, way="activation checkpointing is configure() and checkpoint(function, *args)")
