"""`deepspeed.ops` under zerotrain's name: DeepSpeed's optimizer classes (ops.adam, ops.lamb),
mapped to torch's optimizers by optim/deepspeed_classes.py. No kernels are built."""

from ..helpers.refusals import missing

__getattr__ = missing(__name__, way="zerotrain.ops has adam (FusedAdam, DeepSpeedCPUAdam) and lamb (refused)")
