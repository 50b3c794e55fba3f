"""How initialize builds a tensor-parallel job: the ModelSplit (parallel/split.py) of a split model.

    world = data x tensor (comm/mesh.py; tensor varies fastest, as DeepSpeed's topology)
    every rank starts from global rank 0's weights, then the plan (plan.py) turns the
    split projections into DTensors over the "tensor" dimension (torch's parallelize_module)

ZeRO 0-2 then runs over the data dimension on each rank's local pieces: a DTensor's local
tensor is laid into the flat buffers like any parameter (zero/flat.py). The gradient norm
spans the tensor dimension with each shard counted on its own rank and each replicated
parameter (position embeddings, norms, row-split biases) on tensor rank 0 only. ZeRO 3 is
refused, as DeepSpeed's AutoTP does.

With the vocabulary split (plan.py) the engine is `LossParallelEngine`: forward and
backward run under torch's loss_parallel, so the model's own cross-entropy (GPT's, HF's
loss_function) works on logits sharded by the vocabulary, and the loss comes back a plain
tensor. Logits stay a DTensor sharded by the vocabulary in training (`.full_tensor()`
gathers them) and come back whole in eval mode (an evaluation reads them).
"""

from __future__ import annotations

import logging

import torch

from ...comm.mesh import ParallelMesh
from ...errors import ConfigError
from ...features.engine_methods import TrainingEngine
from ..split import ModelSplit
from ..topology import Grid
from . import dtensor as tp
from .plan import tensor_plan

log = logging.getLogger("zerotrain")


def split_model(model: torch.nn.Module, mesh: ParallelMesh, vocab: bool | None = False,
                plan: dict[str, str] | None = None) -> tuple[dict[int, torch.nn.Parameter], bool]:
    """Split `model` in place over the mesh's tensor dimension (the vocabulary too as `vocab`
    says: plan.py; by `plan` when given, else by the plan read from the model);
    ({id(old parameter): new one} for the parameters that became DTensors (optimizer groups
    built before still name the old), whether the vocabulary is split)."""
    plan, why = tensor_plan(model, mesh.size("tensor"), vocab, plan)
    if why is not None and mesh.state.rank == 0:
        log.info("tensor_parallel: the embedding and LM head stay whole on every tensor rank (%s)", why)
    before = dict(model.named_parameters())
    tp.parallelize(model, mesh.sub_mesh("tensor"), plan)
    after = dict(model.named_parameters())
    return ({id(old): after[name] for name, old in before.items() if after.get(name) is not old},
            "vocab_head" in plan.values())


class LossParallelEngine(TrainingEngine):
    """The engine of a vocabulary-split model: its loss is computed and differentiated on the
    sharded logits (torch's loss_parallel)."""

    def forward(self, *args, **kwargs):
        with tp.loss_context():
            return tp.replicated_local(super().forward(*args, **kwargs), gather=not self.module.training)

    def backward(self, loss: torch.Tensor, retain_graph: bool = False) -> torch.Tensor:
        with tp.loss_context():
            return super().backward(loss, retain_graph)


def replicated(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Trainable parameters every tensor rank holds whole (counted once, on tensor rank 0)."""
    return [p for p in model.parameters() if p.requires_grad and not tp.is_sharded(p)]


def tensor_parallel_split(model: torch.nn.Module, comm, size: int) -> ModelSplit:
    world = comm.state.world_size
    if world % size:
        raise ConfigError(f"tensor_parallel.autotp_size {size}: the job has {world} process{'es' * (world > 1)}, not "
                          f"a multiple of {size}; launch a multiple of {size} (torchrun --nproc_per_node) or lower "
                          "autotp_size")
    mesh = ParallelMesh(comm.state, tensor=size)
    tensor_comm = mesh.comm("tensor")
    replaced: dict[int, torch.nn.Parameter] = {}
    chosen: dict = {}

    def check(cfg) -> None:
        chosen["vocab"] = cfg.tensor_parallel.vocab_parallel_lm_head
        stage = cfg.zero_optimization.stage
        if stage > 2:
            raise ConfigError(f"zero_optimization.stage {stage} with tensor_parallel: use stage 0, 1 or 2 (the "
                              "tensor-parallel pieces are sharded over the data dimension; DeepSpeed's AutoTP "
                              "stops at 2 too)")
        if cfg.pipeline is not None:
            raise ConfigError("tensor_parallel with a pipeline block: build the model as zerotrain.pipe.PipelineModule "
                              "or remove the pipeline block")

    def after_broadcast() -> None:
        for tensor in list(model.parameters()) + list(model.buffers()):
            tensor_comm.broadcast(tensor.data)  # the data dimension already agrees: now the world does
        split, chosen["vocab_split"] = split_model(model, mesh, chosen["vocab"])
        replaced.update(split)

    def make_engine(*args, **kwargs):
        engine = (LossParallelEngine if chosen["vocab_split"] else TrainingEngine)(*args, **kwargs)
        engine.checkpoint_prefix = f"tp_{mesh.coord('tensor'):02d}-"
        engine.mesh, engine.grid = mesh, Grid(mesh)
        engine.input_replica = mesh.coord("tensor") > 0  # every tensor rank of a data index reads the same batch
        return engine

    def uncounted() -> list:
        return replicated(model) if mesh.coord("tensor") > 0 else []

    return ModelSplit(mesh.comm("data"), tensor_comm, uncounted=uncounted, check=check, after_broadcast=after_broadcast,
                  make_engine=make_engine, replaced=replaced)
