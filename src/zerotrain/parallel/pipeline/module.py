"""PipelineModule: DeepSpeed's pipeline model, a list of layers cut into stages.

    layers   [LayerSpec(Embed), LayerSpec(Block) x L, LayerSpec(Head)]   (or modules, functions)
    parts    partition.py: stage s holds layers parts[s] .. parts[s+1]-1
    here     only this rank's stages are built; layer i is submodule str(i), a tied module
             tied_modules.<key>, so state-dict keys are DeepSpeed's

The forward of a stage chains its layers, `x = layer(x)`, a tuple passed as one argument as
DeepSpeed does. What changes from step to step reaches every stage through `set_step`:
`curriculum_seqlen`, `progressive_layer_drop` and `pld_theta` go to each layer whose forward
names them, and the layers chosen by `droppable_layers="type:<regex>"` are skipped by
progressive layer drop with one mask for the whole pipeline,

    keep = keep_mask(D, theta, seed 0, key = optimizer step)    D droppable layers, in order
    kept layer j:  x + (layer(x) - x) / p_j       dropped:  x       (features/layer_drop.py)

the very mask (and scaling) a LayerDrop block list of the same D blocks draws, so every stage
and every data-parallel rank drops the same layers. When no layer names `curriculum_seqlen`,
the engine cuts the batch and the labels to it before the first stage instead.

With a tensor axis in the topology each stage's layers are split over it at initialize, by
the plan read from them (parallel/tensor/plan.py), or by `tensor_plan` ({path under these
names: style}, for the whole layer list; each rank uses the entries of the layers it holds):
the trainer reads an HF model's plan from the whole model and names its modules this way.
"""

from __future__ import annotations

import functools
import random

import numpy as np
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ...comm import init_parallel
from ...comm.mesh import ParallelMesh
from ...errors import ConfigError, ModelInterfaceError
from ...features.layer_drop import keep_mask, keep_probabilities
from .partition import matching_layers, partition
from .spec import LayerSpec, TiedLayerSpec, declared_kwargs, trainable_count

STEP_KWARGS = ("curriculum_seqlen", "progressive_layer_drop", "pld_theta")


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _module_tree(layer) -> list[tuple[str, type]]:
    """(path, class) of a layer's modules, itself first (""); a LayerSpec by the class it builds."""
    if isinstance(layer, nn.Module):
        return [(path, type(m)) for path, m in layer.named_modules()]
    if isinstance(layer, LayerSpec) and not isinstance(layer, TiedLayerSpec):
        return [("", layer.typename)]
    return []


def stage_indices(placement: str, pipe_rank: int, pipe_size: int, virtual: int) -> list[int]:
    """The stages (of pipe_size x virtual) that rank `pipe_rank` runs: one, looped (r, r+P,
    ...) or in a V (r and 2P-1-r)."""
    if virtual == 1:
        return [pipe_rank]
    if placement == "v":
        return [pipe_rank, 2 * pipe_size - 1 - pipe_rank]
    return [pipe_rank + k * pipe_size for k in range(virtual)]


class _Stage(nn.Module):
    """The submodule torch's PipelineStage runs: one stage's layers (shared with the owner)."""

    def __init__(self, owner: PipelineModule, index: int, start: int, stop: int, modules: list[nn.Module]):
        super().__init__()
        object.__setattr__(self, "owner", owner)  # not a submodule: no second set of state-dict keys
        self.index, self.start, self.stop = index, start, stop
        self.layers = nn.ModuleList(modules)
        self.micro_batch = 0  # set by the torch stage that runs it (schedules.py) before each forward

    def forward(self, *inputs):
        return self.owner.run_layers(self.start, self.stop, inputs, self.micro_batch)


class PipelineModule(nn.Module):
    def __init__(self, layers, num_stages: int | None = None, topology=None, loss_fn=None, seed_layers: bool = False,
                 seed_fn=None, base_seed: int = 1234, partition_method: str = "parameters",
                 activation_checkpoint_interval: int = 0, activation_checkpoint_func=None,
                 checkpointable_layers: list[str] | None = None, dynamic_shape: bool = False,
                 droppable_layers: str | None = None, virtual_stages: int = 1, placement: str = "loop",
                 tensor_plan: dict[str, str] | None = None):
        super().__init__()
        specs = list(layers.children() if isinstance(layers, nn.Sequential) else layers)
        if num_stages is None and topology is None:
            raise ConfigError("PipelineModule needs num_stages=<pipeline stages> (or topology=...)")
        state = init_parallel()
        tensor = 1
        if topology is not None:
            tensor = max(1, topology.get_dim("model"))  # its blocks are split over it at initialize
            if topology.world_size() != state.world_size:
                raise ConfigError(f"PipelineModule topology covers {topology.world_size()} ranks, the world has "
                                  f"{state.world_size}")
            num_stages = topology.get_dim("pipe")
        if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
            raise ConfigError(f"PipelineModule num_stages should be a positive integer, got {num_stages!r}")
        if state.world_size % (num_stages * tensor):
            raise ConfigError(f"the world size {state.world_size} is not divisible by the pipeline size "
                              f"{num_stages} (num_stages)" + (f" x tensor size {tensor}" if tensor > 1 else "")
                              + f"; launch a multiple of {num_stages * tensor} processes")
        if placement not in ("loop", "v") or virtual_stages < 1 or (placement == "v" and virtual_stages != 2):
            raise ConfigError(f"PipelineModule virtual_stages={virtual_stages}, placement={placement!r}: use "
                              "placement 'loop' with virtual_stages >= 1, or 'v' with virtual_stages 2")
        total = num_stages * virtual_stages
        if len(specs) < total:
            raise ConfigError(f"PipelineModule has {len(specs)} layers for {total} stages; every stage needs a "
                              f"layer: use num_stages <= {len(specs) // virtual_stages} or add layers")
        self.loss_fn = loss_fn
        self.num_stages, self.virtual_stages, self.placement = num_stages, virtual_stages, placement
        self.dynamic_shape = dynamic_shape
        self.activation_checkpoint_interval = activation_checkpoint_interval
        self.activation_checkpoint_func = activation_checkpoint_func
        self.checkpointable_layers = checkpointable_layers
        self.use_reentrant = False
        self.tensor_plan = dict(tensor_plan) if tensor_plan is not None else None
        self.mesh = ParallelMesh(state, pipe=num_stages, tensor=tensor)
        self._layer_specs = specs
        self.parts = partition(specs, total, partition_method, trainable_count)
        self.stage_ids = stage_indices(placement, self.mesh.coord("pipe"), num_stages, virtual_stages)
        if droppable_layers and not str(droppable_layers).startswith("type:"):
            raise ConfigError(f"droppable_layers {droppable_layers!r}: give 'type:<regex of layer class names>'")
        self.droppable = matching_layers(specs, droppable_layers[5:], "droppable_layers") if droppable_layers else []
        self._kwargs_of = [declared_kwargs(layer, STEP_KWARGS) for layer in specs]
        self.cuts_batch = not any("curriculum_seqlen" in k for k in self._kwargs_of)
        self.takes_pld = bool(self.droppable) or any("pld_theta" in k for k in self._kwargs_of)
        self._layer_modules = [_module_tree(layer) for layer in specs]  # before _build forgets other stages'
        self.micro_batch = 0  # the micro-batch of the step the layers run now (run_layers)
        self.tied_modules = nn.ModuleDict()
        self.tied_weight_attrs: dict[str, list[str]] = {}
        self._funcs: dict[int, object] = {}
        self._build(seed_layers, seed_fn, base_seed)
        self._step: dict = {}
        self._drop: dict[int, tuple[bool, float]] = {}
        self.to(state.device)

    # ---- construction ----------------------------------------------------------------------
    def stage_owner(self, layer_idx: int) -> int:
        """The pipeline stage that holds layer `layer_idx`."""
        return next(s for s in range(len(self.parts) - 1) if self.parts[s] <= layer_idx < self.parts[s + 1])

    def _build(self, seed_layers: bool, seed_fn, base_seed: int) -> None:
        self._stages = []
        for stage in self.stage_ids:
            start, stop = self.parts[stage], self.parts[stage + 1]
            modules = []
            for idx in range(start, stop):
                layer = self._layer_specs[idx]
                if seed_layers:
                    (seed_fn or _seed_everything)(base_seed + idx)
                if isinstance(layer, TiedLayerSpec):
                    if layer.key not in self.tied_modules:
                        self.tied_modules[layer.key] = layer.build()
                        self.tied_weight_attrs[layer.key] = layer.tied_weight_attr
                    module = self.tied_modules[layer.key]
                    fn = functools.partial(layer.forward_fn, module) if layer.forward_fn else module
                elif isinstance(layer, LayerSpec):
                    module = fn = layer.build()
                    self.add_module(str(idx), module)
                elif isinstance(layer, nn.Module):
                    module = fn = layer
                    self.add_module(str(idx), module)
                elif callable(layer):
                    module, fn = None, layer
                else:
                    raise ConfigError(f"PipelineModule layer {idx} is a {type(layer).__name__}; give modules, "
                                      "LayerSpecs or functions")
                self._funcs[idx] = fn
                if module is not None:
                    modules.append(module)
            self._stages.append(_Stage(self, stage, start, stop, modules))
        # specs given as modules live on every rank: keep only this rank's
        self._layer_specs = [s if isinstance(s, LayerSpec) or not isinstance(s, nn.Module) else None
                             for s in self._layer_specs]

    def layers_of_class(self, layer_class) -> list[tuple[str, nn.Module | None]]:
        """The modules of `layer_class` in the whole pipeline, in layer order, by their names
        here ("<layer>.<path>"): this rank's modules, None for those another stage holds. A
        LayerSpec counts by the class it builds; what it builds inside is not known here."""
        found = []
        for idx, tree in enumerate(self._layer_modules):
            held = self._modules.get(str(idx))
            for path, kind in tree:
                if isinstance(kind, type) and issubclass(kind, layer_class):
                    name = f"{idx}.{path}" if path else str(idx)
                    found.append((name, held.get_submodule(path) if held is not None else None))
        return found

    def stages(self) -> list[_Stage]:
        """This rank's stages, in order, as the submodules of torch's PipelineStages."""
        return self._stages

    def tie_keys(self) -> dict[str, list[int]]:
        """Each tied key -> the pipeline stages that use it (known on every rank)."""
        keys: dict[str, list[int]] = {}
        for idx, layer in enumerate(self._layer_specs):
            if isinstance(layer, TiedLayerSpec):
                keys.setdefault(layer.key, []).append(self.stage_owner(idx))
        return {k: sorted(set(v)) for k, v in sorted(keys.items())}

    def tied_layers(self) -> dict[str, int]:
        """Each tied key -> the first layer using it (where a plain model of the same layers
        holds it: checkpoint/pipe_names.py)."""
        first: dict[str, int] = {}
        for idx, layer in enumerate(self._layer_specs):
            if isinstance(layer, TiedLayerSpec):
                first.setdefault(layer.key, idx)
        return first

    def tied_weights(self, key: str) -> list[nn.Parameter]:
        out = []
        for attr in self.tied_weight_attrs.get(key, []):
            obj = self.tied_modules[key]
            for part in attr.split("."):
                obj = getattr(obj, part)
            out.append(obj)
        return out

    def held_tensor_plan(self) -> dict[str, str] | None:
        """The entries of `tensor_plan` whose layer this rank holds (None: no plan was given,
        the split is read from the layers)."""
        if self.tensor_plan is None:
            return None

        def held(path: str) -> bool:
            head, _, rest = path.partition(".")
            return rest.partition(".")[0] in self.tied_modules if head == "tied_modules" else head in self._modules

        return {path: style for path, style in self.tensor_plan.items() if held(path)}

    def partitions(self) -> list[int]:
        return self.parts

    def topology(self):
        from ..topology import PipeDataParallelTopology, PipeModelDataParallelTopology

        if self.mesh.size("tensor") > 1:
            return PipeModelDataParallelTopology(self.num_stages, self.mesh.size("tensor"), self.mesh.size("data"))
        return PipeDataParallelTopology(self.num_stages, self.mesh.size("data"))

    def num_pipeline_stages(self) -> int:
        return self.num_stages

    # ---- the step's context ------------------------------------------------------------------
    def set_step(self, kwargs: dict, key: int) -> None:
        """What the features said for this step (curriculum_seqlen, PLD), for every stage."""
        self._step = {k: kwargs[k] for k in STEP_KWARGS if kwargs.get(k) is not None}
        self._drop = {}
        if not (kwargs.get("progressive_layer_drop") and self.training):
            return
        if not self.takes_pld:
            raise ModelInterfaceError(
                "progressive_layer_drop is enabled but no layer of the PipelineModule can be dropped or takes "
                "pld_theta: pass droppable_layers='type:<regex of block class names>' or disable it")
        theta = float(kwargs["pld_theta"])
        if self.droppable:
            probs = keep_probabilities(len(self.droppable), theta)
            mask = keep_mask(len(self.droppable), theta, 0, key)
            self._drop = {idx: (keep, p) for idx, keep, p in zip(self.droppable, mask, probs)}

    def _call(self, idx: int, x):
        fn = self._funcs[idx]
        kwargs = {k: self._step[k] for k in self._kwargs_of[idx] if k in self._step}
        plan = self._drop.get(idx)
        if plan is None:
            return fn(x, **kwargs)
        keep, p = plan
        if not keep:
            return x
        out = fn(x, **kwargs)
        return out if p == 1.0 else x + (out - x) / p

    def _checkpointable(self, idxs: range) -> bool:
        fns = [self._funcs[i] for i in idxs]
        if self.checkpointable_layers is not None:
            return all(type(f).__name__ in self.checkpointable_layers for f in fns)
        return any(isinstance(f, nn.Module) and any(True for _ in f.parameters()) for f in fns)

    def run_layers(self, start: int, stop: int, inputs: tuple, micro_batch: int = 0):
        """Layers start..stop-1 on one micro-batch; `micro_batch` (its place in the step) is
        `self.micro_batch` while they run, recomputed runs included, for layers that key
        anything by it (random-LTD's kept tokens)."""
        def run(lo: int, hi: int):
            def chain(*xs):
                self.micro_batch = micro_batch
                x = xs[0] if len(xs) == 1 else xs
                for idx in range(lo, hi):
                    x = self._call(idx, x)
                return x
            return chain

        every = self.activation_checkpoint_interval
        if not every or not self.training:
            return run(start, stop)(*inputs)
        x = inputs
        for lo in range(start, stop, every):
            hi = min(lo + every, stop)
            xs = x if isinstance(x, tuple) else (x,)
            # reentrant checkpointing gives no gradient to a run whose inputs need none (the
            # embedding's token ids): such a run is not recomputed
            recompute = self._checkpointable(range(lo, hi)) and torch.is_grad_enabled() and \
                (not self.use_reentrant or any(torch.is_tensor(t) and t.requires_grad for t in xs))
            if not recompute:
                x = run(lo, hi)(*xs)
            elif self.activation_checkpoint_func is not None:
                x = self.activation_checkpoint_func(run(lo, hi), *xs)
            else:
                x = checkpoint(run(lo, hi), *xs, use_reentrant=self.use_reentrant)
        return x

    def forward(self, *inputs, curriculum_seqlen=None, progressive_layer_drop=False, pld_theta=None):
        """All layers, for a PipelineModule of one stage (more stages run through the engine's
        train_batch / eval_batch)."""
        if len(self._stages) != 1 or self.num_stages != 1:
            raise TypeError("a PipelineModule of several stages runs through engine.train_batch() and "
                            "engine.eval_batch(), not by calling it")
        self.set_step({"curriculum_seqlen": curriculum_seqlen, "progressive_layer_drop": progressive_layer_drop,
                       "pld_theta": pld_theta}, key=0)
        return self._stages[0](*inputs)
