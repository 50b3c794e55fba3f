"""`zerotrain.zero.Init()`: build a model already partitioned for ZeRO stage 3.

    with zerotrain.zero.Init():
        model = MyTransformer(cfg)        # never whole on any rank
    engine, *_ = zerotrain.initialize(model=model, config=stage3_config)

A module's parameters are whole only while that module's own __init__ runs. When the module
is attached to its parent (torch's module-registration hook fires after the child's
__init__ has returned), rank 0's values are broadcast and each rank keeps its chunk; the
root's own parameters are cut on leaving the context. Code that initialises weights later
through `module.apply(fn)` (as most models do) sees each module's parameters whole for the
duration of `fn`, and the result is cut again. Any other use of a parameter already cut
(HF's initialisation, torch.nn.init, reading `.data`, `copy.deepcopy` of a layer) goes
through `PartitionedParameter` (partitioned_param.py): the parameters a call touches are
glued whole for it and cut again when the next call glues others, so at most the params of
one call are whole at a time; a deep copy carries its chunk along.
"""

from __future__ import annotations

import torch
from torch import nn

from ..comm import Comm, init_parallel
from .layout import cut, glue
from .partitioned_param import PartitionedParameter, make_partitioned


def is_partitioned(p: torch.Tensor) -> bool:
    return hasattr(p, "zt_chunk")


def full_shape(p: torch.Tensor) -> torch.Size:
    return p.zt_shape if is_partitioned(p) else p.shape


class Init:
    def __init__(self, enabled: bool = True, **_ignored):
        self.enabled = enabled
        self.comm: Comm | None = None
        self.active = False
        self._created: list[nn.Parameter] = []
        self._glued: list[nn.Parameter] = []  # whole for the latest call that touched them

    # ---- cutting and gluing ----------------------------------------------------------------
    def _cut(self, p: nn.Parameter, src: int = 0) -> None:
        if is_partitioned(p) or p.numel() == 0:
            return
        self.comm.broadcast(p.data, src=src)
        make_partitioned(p, self, p.shape)
        p.zt_chunk = cut(p.data.reshape(-1), self.comm.world_size)[self.comm.rank].clone()
        p.data = torch.empty(0, dtype=p.dtype, device=p.device)

    def _glue(self, p: nn.Parameter) -> None:
        ws = self.comm.world_size
        whole = torch.empty(ws * p.zt_chunk.numel(), dtype=p.zt_chunk.dtype, device=p.zt_chunk.device)
        self.comm.all_gather(whole, p.zt_chunk)
        p.data = glue(whole, p.zt_shape)
        del p.zt_chunk

    # ---- PartitionedParameter's owner while the model is built (partitioned_param.TouchHandler)
    def is_empty(self, p: nn.Parameter) -> bool:
        return is_partitioned(p)

    def make_whole(self, params: list[nn.Parameter], func) -> None:
        if not self.active:  # the model is built; the stage-3 engine takes over at initialize
            return
        for old in self._glued:
            if all(old is not q for q in params):
                self._cut(old)
        for q in params:
            if is_partitioned(q):
                self._glue(q)
        self._glued = [q for q in params if type(q) is PartitionedParameter]

    def explain_failure(self, p, func, error):
        from ..errors import ConfigError

        name = getattr(func, "__name__", str(func))
        return ConfigError(f"a parameter of shape {tuple(p.zt_shape)} built under zerotrain.zero.Init() is partitioned "
                           f"across ranks and empty here; {name} cannot use it before zerotrain.initialize gathers it "
                           "(or inside `with zerotrain.zero.GatheredParameters(params):`)")

    # ---- hooks -----------------------------------------------------------------------------
    def _on_parameter(self, module, name, param):
        if param is not None:
            self._created.append(param)

    def _on_submodule(self, module, name, submodule):
        if submodule is not None:
            for p in submodule.parameters():
                self._cut(p)

    def _whole_apply(self):
        """nn.Module.apply that shows `fn` each module's own parameters whole."""
        def apply(module: nn.Module, fn):
            for child in module.children():
                child.apply(fn)
            own = [p for p in module.parameters(recurse=False) if is_partitioned(p)]
            for p in own:
                self._glue(p)
            fn(module)
            for p in own:
                self._cut(p)
            return module

        return apply

    def __enter__(self):
        if not self.enabled:
            return self
        self.comm = Comm(init_parallel())
        self.active = True
        self._hooks = [nn.modules.module.register_module_parameter_registration_hook(self._on_parameter),
                       nn.modules.module.register_module_module_registration_hook(self._on_submodule)]
        self._original_apply, nn.Module.apply = nn.Module.apply, self._whole_apply()
        return self

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        for h in self._hooks:
            h.remove()
        nn.Module.apply = self._original_apply
        if exc[0] is None:
            for p in self._created + self._glued:  # the root's own parameters, and any left over
                self._cut(p)
        self.active = False
        self._created, self._glued = [], []
        return False
