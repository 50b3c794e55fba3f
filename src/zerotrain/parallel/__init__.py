"""How the ranks of a job split the model between them (pipeline stages, tensor slices) and
what follows for the data-parallel strategy: DeepSpeed's topology queries (topology.py), the
gradient norm over every part of the model (norm.py), a Megatron-style mpu (mpu.py), the
tensor-parallel split (tensor_plan.py: which layers, tensor.py: the layout initialize uses)."""
