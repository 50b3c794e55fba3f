"""`deepspeed.runtime.data_pipeline.data_sampling.data_analyzer` under zerotrain's name: the
alias of zerotrain.data_efficiency.analyzer (DataAnalyzer, DistributedDataAnalyzer)."""

from ....data_efficiency.analyzer import DataAnalyzer, DistributedDataAnalyzer
from ....helpers.refusals import missing

__all__ = ["DataAnalyzer", "DistributedDataAnalyzer"]
__getattr__ = missing(__name__, way="zerotrain.data_efficiency has DataAnalyzer and DistributedDataAnalyzer")
