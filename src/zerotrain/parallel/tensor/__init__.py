"""Tensor parallelism on torch's DTensor: plan.py (which layers are split, and how),
setup.py (how initialize builds a tensor-parallel job), dtensor.py (the thin wrappers over
torch.distributed.tensor, the only file here that imports it) and config.py (the
"tensor_parallel" config block)."""
