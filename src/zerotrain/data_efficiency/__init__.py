"""DeepSpeed's Data Efficiency library under zerotrain's names: the data analyzer that writes
the difficulty index files the curriculum sampler reads, and random layerwise token dropping
(random-LTD). The config block is read by `zerotrain.config.data_efficiency`; the sampling
curriculum lives in `zerotrain.data.curriculum_sampler`."""

from .analyzer import DataAnalyzer, DistributedDataAnalyzer
from .random_ltd import RandomLTDScheduler, kept_token_indices, layer_averaged_length, random_ltd_value
from .routing import convert_to_random_ltd, remove_random_ltd_state_dict, save_without_random_ltd

__all__ = ["DataAnalyzer", "DistributedDataAnalyzer", "RandomLTDScheduler", "convert_to_random_ltd",
           "kept_token_indices", "layer_averaged_length", "random_ltd_value", "remove_random_ltd_state_dict",
           "save_without_random_ltd"]
