"""DeepSpeed names zerotrain does not provide, each with the zerotrain way: one line instead of
an AttributeError or ModuleNotFoundError deep in a script.

Two doors lead here. A module's `__getattr__ = missing(__name__, ...)` answers an attribute
look-up (`zerotrain.init_inference`, `from zerotrain.ops.adam import FusedAdagrad`), and the
import finder answers a module path (`from zerotrain.moe.layer import MoE`). Both raise
NotBuiltError, an ImportError, whose message is the table's line.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

from ..errors import NotBuiltError

_NO_INFERENCE = "zerotrain trains; for inference call engine.module or load the saved model with transformers"
_NO_KERNELS = "DeepSpeed's fused kernels are not built; keep the model's own layers"
_NO_MOE = "there are no expert (MoE) layers"

# DeepSpeed's path below its package -> the zerotrain way. A module path covers its members.
REFUSED = {
    "init_inference": _NO_INFERENCE,
    "InferenceEngine": _NO_INFERENCE,
    "DeepSpeedInferenceConfig": _NO_INFERENCE,
    "inference": _NO_INFERENCE,
    "tp_model_init": "tensor parallelism is the config's tensor_parallel block, applied by initialize",
    "DeepSpeedTransformerLayer": _NO_KERNELS,
    "DeepSpeedTransformerConfig": _NO_KERNELS,
    "replace_transformer_layer": _NO_KERNELS,
    "revert_transformer_layer": _NO_KERNELS,
    "module_inject": _NO_KERNELS,
    "ops.transformer": _NO_KERNELS,
    "ops.sparse_attention": "sparse attention is not built; use the model's attention (the sparse_attention block "
                            "is refused)",
    "ops.adagrad": "use the config's optimizer block with type Adagrad (torch.optim.Adagrad)",
    "ops.lion": "Lion is not built; use Adam, AdamW or a torch optimizer by name in the optimizer block",
    "ops.adam.FusedAdamW": "use zerotrain.ops.adam.FusedAdam (adam_w_mode=True), a torch AdamW",
    "ops.op_builder": "zerotrain builds no C++/CUDA extensions",
    "moe.layer": _NO_MOE,  # moe.utils answers for models without expert layers (zerotrain/moe/)
    "moe.experts": _NO_MOE,
    "moe.sharded_moe": _NO_MOE,
    "moe.mappings": _NO_MOE,
    "compression": "DeepSpeed's compression library is not built",
    "add_core_arguments": "zerotrain.add_config_arguments(parser) adds --deepspeed and --deepspeed_config",
    "runtime.data_pipeline.data_sampling.data_sampler": "the sampling curriculum is the config's data_efficiency "
                                                        "block (initialize(training_data=...) builds its sampler)",
    "runtime.data_pipeline.curriculum_scheduler": "use zerotrain.CurriculumScheduler",
    "runtime.data_pipeline.data_routing.basic_layer": "random-LTD routes layers in place, without a wrapper "
                                                      "class: zerotrain.data_efficiency.convert_to_random_ltd",
    "runtime.data_pipeline.data_routing.utils": "random-LTD's gather and scatter are "
                                                "zerotrain.data_efficiency.random_ltd.gather_tokens / scatter_tokens",
    "runtime.zero.partition_parameters": "use zerotrain.zero.Init and zerotrain.zero.GatheredParameters; "
                                         "parameters carry no ds_* attributes",
    "runtime.pipe": "use zerotrain.pipe (PipelineModule, LayerSpec, TiedLayerSpec, ProcessTopology)",
    "runtime.domino": "Domino tensor-parallel overlap is not built",
    "utils.groups": "process groups: zerotrain.comm.new_group; the layout is built by initialize",
    "checkpointing.model_parallel_cuda_manual_seed": "model-parallel RNG tracking is not built; "
                                                     "use zerotrain.runtime.utils.set_random_seed",
    "checkpointing.get_cuda_rng_tracker": "model-parallel RNG tracking is not built; "
                                          "use zerotrain.runtime.utils.set_random_seed",
}

_WHERE = "docs/migrating.md lists the DeepSpeed names zerotrain has"


def refusal(path: str) -> str | None:
    """The line for `path` (below the package) or for the refused module holding it."""
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        why = REFUSED.get(".".join(parts[:n]))
        if why is not None:
            return f"zerotrain.{path}: not in zerotrain ({why})"
    return None


def missing(module: str, *, way: str = _WHERE, strict: bool = True):
    """A module `__getattr__` for the DeepSpeed-named modules: a refused name raises its line,
    any other public name one line naming it and `way` (NotBuiltError; with `strict` False an
    AttributeError, so that `getattr(zerotrain, name, default)` probes keep working); dunder
    probes (inspect, pickle) get the plain AttributeError they expect."""
    below = module.partition(".")[2]

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        path = f"{below}.{name}" if below else name
        line = refusal(path)
        package = sys.modules.get(module)
        if line is None and hasattr(package, "__path__") and importlib.util.find_spec(f"{module}.{name}"):
            return importlib.import_module(f"{module}.{name}")  # a submodule not imported yet
        if line is None and not strict:
            raise AttributeError(f"{module}.{name}: not in zerotrain; {way}", name=name, obj=sys.modules.get(module))
        raise NotBuiltError(line or f"{module}.{name}: not in zerotrain; {way}", name=name)

    return __getattr__


class _Finder(importlib.abc.MetaPathFinder):
    """Last on sys.meta_path: reached only for a `zerotrain.` module nothing else found."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("zerotrain.") and (line := refusal(fullname.partition(".")[2])):
            raise NotBuiltError(line, name=fullname)
        return None


def install_finder() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
