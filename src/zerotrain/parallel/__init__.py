"""How the ranks of a job split the model between them and what follows for the data-parallel
strategy: one folder per parallelism (pipeline/: pipeline stages, tensor/: tensor slices, each
with its torch.distributed wrappers and its config block), DeepSpeed's topology queries both
answer (topology.py), the gradient norm over every part of the model (norm.py), a
Megatron-style mpu (mpu.py) and what initialize needs to know of the split (split.py)."""
