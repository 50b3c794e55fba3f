"""Pipeline parallelism with DeepSpeed's API on torch.distributed.pipelining (its public names
are re-exported by zerotrain.pipe, the DeepSpeed-named alias of this package).

module.py (the layers, their partition and per-step context), spec.py (LayerSpec,
TiedLayerSpec), partition.py (which layers each stage holds), engine.py (train_batch),
data.py (reading a step), stages.py (torch's stages per input shape), ties.py (tied layers),
setup.py (what initialize does with one), schedules.py (the thin wrappers over
torch.distributed.pipelining: stages and schedules by name), from_model.py (a model the
trainer built, cut into stages) and config.py (the "pipeline" config block). DeepSpeed's
topology queries live in parallel/topology.py, beside tensor parallelism's use of them.
"""
