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

import logging

import torch
from torch import nn

from ...comm import Comm, init_parallel
from ...errors import ConfigError
from ..offload.host_memory import return_large_blocks
from ..layout import cut, glue
from .partitioned_param import PartitionedParameter, make_partitioned


def is_partitioned(p: torch.Tensor) -> bool:
    return hasattr(p, "zt_chunk")


def full_shape(p: torch.Tensor) -> torch.Size:
    return p.zt_shape if is_partitioned(p) else p.shape


log = logging.getLogger("zerotrain")

# DeepSpeed's arguments of zero.Init that only tune its own machinery: accepted, named.
_NO_EFFECT = {
    "mem_efficient_linear": "a memory-saving autograd function for nn.Linear; torch's own is used",
    "pin_memory": "pinned host chunks; placement is the config's offload_param at initialize",
    "remote_device": "where the chunks wait; they stay in host memory until initialize places them as the "
                     "config's offload_param says",
}
# ...and those that would change who holds what or the numbers: refused unless left off.
_REFUSED = ("data_parallel_group", "mpu", "zero_param_parallel_group", "sequence_data_parallel_group",
            "param_swapper", "zero_quantized_weights", "zero_quantized_nontrainable_weights")


class Init:
    """DeepSpeed's signature: `module` partitions a model built already; `dtype` (or the
    fp16/bf16 block of `config_dict_or_path`/`config`) is the dtype the chunks are kept in;
    the arguments that tune DeepSpeed's machinery are named in a notice, those that would
    change who holds what are refused unless left at their defaults."""

    def __init__(self, module: nn.Module | None = None, data_parallel_group=None, mem_efficient_linear: bool = True,
                 remote_device: str | None = None, pin_memory: bool = False, config_dict_or_path=None, config=None,
                 enabled: bool = True, dtype: torch.dtype | None = None, mpu=None, zero_param_parallel_group=None,
                 zero_quantized_weights: bool = False, zero_quantized_nontrainable_weights: bool = False,
                 sequence_data_parallel_group=None, param_swapper=None):
        given = locals()
        for name in _REFUSED:
            if given[name] not in (None, False):
                raise ConfigError(f"zerotrain.zero.Init({name}=...): not supported; remove it (zero.Init partitions "
                                  "across every rank of the world, at full precision of `dtype`)")
        if remote_device not in (None, "none", "cpu", "nvme"):
            raise ConfigError(f"zerotrain.zero.Init(remote_device={remote_device!r}): use 'cpu', 'nvme' or None")
        self._offloaded = remote_device in ("cpu", "nvme")  # host memory is the ceiling of this run
        defaults = {"mem_efficient_linear": True, "pin_memory": False, "remote_device": None}
        named = [n for n, v in defaults.items() if given[n] != v and not (n == "remote_device" and given[n] == "none")]
        self._notice = ("zerotrain.zero.Init: no effect here: " + "; ".join(f"{n} ({_NO_EFFECT[n]})" for n in named)
                        if named else None)
        if config is not None and config_dict_or_path is not None:
            raise ConfigError("zerotrain.zero.Init: config and config_dict_or_path are the same argument; pass one")
        self.dtype = dtype if dtype is not None else _config_dtype(config if config is not None else config_dict_or_path)
        self.enabled = enabled
        self.comm: Comm | None = None
        self.active = False
        self._created: list[nn.Parameter] = []
        self._glued: list[nn.Parameter] = []  # whole for the latest call that touched them
        if module is not None and enabled:  # a model built already: partitioned here and now
            self._start()
            for p in module.parameters():
                self._cut(p)

    def _start(self) -> None:
        self.comm = Comm(init_parallel())
        if self._offloaded:
            return_large_blocks()  # the chunks and the step's temporaries: offload/host_memory.py
        if self._notice and self.comm.rank == 0:
            log.warning(self._notice)  # before initialize has set up zerotrain's log: a warning shows
            self._notice = None

    # ---- cutting and gluing ----------------------------------------------------------------
    def _cut(self, p: nn.Parameter, src: int = 0) -> None:
        if is_partitioned(p) or p.numel() == 0:
            return
        self.comm.broadcast(p.data, src=src)
        make_partitioned(p, self, p.shape)
        chunk = cut(p.data.reshape(-1), self.comm.world_size)[self.comm.rank]
        dtype = self.dtype if self.dtype is not None and p.is_floating_point() else p.dtype
        p.zt_chunk = chunk.to(dtype, copy=True)  # a copy: a view would keep the whole tensor alive
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
        from ...errors import ConfigError

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
        self._start()
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


def _config_dtype(config) -> torch.dtype | None:
    """The dtype a DeepSpeed config trains in (its fp16/bf16 block), None without a config."""
    if config is None:
        return None
    from ...config import read_config

    raw = read_config(config)  # only the precision blocks: the rest may still say "auto"

    def on(*names) -> bool:
        return any(isinstance(raw.get(n), dict) and raw[n].get("enabled") is True for n in names)

    return torch.float16 if on("fp16") else torch.bfloat16 if on("bf16", "bfloat16") else None
