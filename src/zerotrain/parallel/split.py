"""What initialize needs to know about how the ranks split the model.

The plain case: every rank holds the whole model and ZeRO runs over the world. A pipeline
(pipeline/setup.py), a tensor-parallel split (tensor/setup.py), a sequence-parallel one
(sequence/setup.py) or a Megatron-style mpu (mpu.py) says instead which data-parallel group ZeRO
runs over, which model-parallel group the gradient norm spans (parallel/norm.py), what to do
after the initial weights are broadcast, and which engine to build.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..engine.engine import Engine
from ..features.engine_methods import TrainingEngine
from ..errors import ConfigError
from .norm import ModelParallelNorm


@dataclass
class ModelSplit:
    data_comm: object  # the Comm ZeRO runs over
    model_comm: object = None  # the Comm over the other parts of the model (None: there are none)
    uncounted: Callable[[], list] = field(default=lambda: [])
    check: Callable[[object], None] = field(default=lambda cfg: None)
    after_broadcast: Callable[[], None] = field(default=lambda: None)
    make_engine: Callable[..., Engine] = TrainingEngine
    #: parameters after_broadcast replaced (a tensor-parallel split): {id(old): new}, so the
    #: param groups and a client optimizer made before initialize train the new ones
    replaced: dict = field(default_factory=dict)
    #: the Comm over the ranks that read different batches, when not data_comm's (sequence
    #: ranks share each batch but ZeRO runs over them too): the batch sizes and the loader count it
    batch_comm: object = None
    #: True where each micro-batch's gradients add into the parameters' .grad before the
    #: engine sees them (a pipeline: torch's schedule runs every backward of the step), so no
    #: wider accumulator (data_types.grad_accum_dtype) can be filled and none is kept
    accumulates_in_grads: bool = False

    def wrap(self, strategy):
        if self.model_comm is None or self.model_comm.alone:
            return strategy
        return ModelParallelNorm(strategy, self.model_comm, self.uncounted())


def plain_split(model, comm) -> ModelSplit:
    def check(cfg) -> None:
        if cfg.pipeline is not None:
            raise ConfigError(f"pipeline: the model is a {type(model).__name__}, not a zerotrain.pipe.PipelineModule; "
                              "build it as PipelineModule(layers=[...], num_stages=...) or remove the pipeline block")

    return ModelSplit(comm, check=check)
