"""`deepspeed.runtime.data_pipeline.data_routing.scheduler`: zerotrain's RandomLTDScheduler."""

from ....data_efficiency.random_ltd import RandomLTDScheduler
from ....helpers.refusals import missing

__all__ = ["RandomLTDScheduler"]
__getattr__ = missing(__name__, way="the scheduler is RandomLTDScheduler (fixed_linear only, as DeepSpeed's)")
