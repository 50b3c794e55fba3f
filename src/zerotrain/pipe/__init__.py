"""Pipeline parallelism with DeepSpeed's API on torch.distributed.pipelining.

    from zerotrain.pipe import PipelineModule, LayerSpec, TiedLayerSpec
    net = PipelineModule(layers=[LayerSpec(Embed, ...), *[LayerSpec(Block, ...)] * 8, LayerSpec(Head, ...)],
                         num_stages=2, loss_fn=loss)
    engine, *_ = zerotrain.initialize(model=net, config="ds_config.json")
    loss = engine.train_batch(data_iter=iter(loader))      # yields (inputs, labels)

module.py (the layers, their partition and per-step context), engine.py (train_batch), data.py
(reading a step), stages.py (torch's stages per input shape), ties.py (tied layers),
setup.py (what initialize does with one); comm/pipelining.py and comm/mesh.py hold the torch.distributed side.
"""

from ..parallel.topology import PipeDataParallelTopology, PipeModelDataParallelTopology, ProcessTopology
from .data import RepeatingLoader
from .engine import PipelineEngine
from .module import PipelineModule
from .spec import LayerSpec, TiedLayerSpec

__all__ = ["PipelineModule", "LayerSpec", "TiedLayerSpec", "PipelineEngine", "RepeatingLoader",
           "ProcessTopology", "PipeDataParallelTopology", "PipeModelDataParallelTopology"]
