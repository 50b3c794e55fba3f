"""`zerotrain.pipe`: the DeepSpeed-named alias of zerotrain.parallel.pipeline, so that a
DeepSpeed script's `from deepspeed.pipe import ...` becomes `from zerotrain.pipe import ...`.

    from zerotrain.pipe import PipelineModule, LayerSpec, TiedLayerSpec
    net = PipelineModule(layers=[LayerSpec(Embed, ...), *[LayerSpec(Block, ...)] * 8, LayerSpec(Head, ...)],
                         num_stages=2, loss_fn=loss)
    engine, *_ = zerotrain.initialize(model=net, config="ds_config.json")
    loss = engine.train_batch(data_iter=iter(loader))      # yields (inputs, labels)

The code lives in parallel/pipeline/ (see its __init__ for the map of its files) and the
topologies in parallel/topology.py; this module only re-exports their public names.
"""

from ..parallel.pipeline.data import RepeatingLoader
from ..parallel.pipeline.engine import PipelineEngine
from ..parallel.pipeline.module import PipelineModule
from ..parallel.pipeline.spec import LayerSpec, TiedLayerSpec
from ..parallel.topology import PipeDataParallelTopology, PipeModelDataParallelTopology, ProcessTopology

__all__ = ["PipelineModule", "LayerSpec", "TiedLayerSpec", "PipelineEngine", "RepeatingLoader",
           "ProcessTopology", "PipeDataParallelTopology", "PipeModelDataParallelTopology"]
