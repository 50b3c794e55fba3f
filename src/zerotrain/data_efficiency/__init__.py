"""DeepSpeed's Data Efficiency library under zerotrain's names: the data analyzer that writes
the difficulty index files the curriculum sampler reads, and random layerwise token dropping
(random-LTD). The config block is read by `zerotrain.config.data_efficiency`; the sampling
curriculum lives in `zerotrain.data.curriculum_sampler`."""
