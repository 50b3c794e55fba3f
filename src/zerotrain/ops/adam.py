"""`deepspeed.ops.adam` under zerotrain's name: the DeepSpeed-named alias of
optim/deepspeed_classes.py (FusedAdam and DeepSpeedCPUAdam build torch's Adam/AdamW)."""

from ..helpers.refusals import missing
from ..optim.deepspeed_classes import DeepSpeedCPUAdam, FusedAdam

__all__ = ["FusedAdam", "DeepSpeedCPUAdam"]
__getattr__ = missing(__name__, way="zerotrain.ops.adam has FusedAdam and DeepSpeedCPUAdam")
