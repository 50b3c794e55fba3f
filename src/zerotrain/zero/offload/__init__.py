"""ZeRO-Offload and ZeRO-Infinity: where the fp32 masters, the optimizer state and the stage-3
parameter shards live when not on the compute device. placement.py (which of them goes where,
and which optimizer steps them), blockwise_optimizer.py (masters stepped block by block),
step_behind.py (that step run behind the next forward), nvme_swap.py (the NVMe files),
param_shard_store.py (a stage-3 rank's parameter shard on the device, the host or NVMe) and
host_memory.py (freed host memory given back to the system)."""
